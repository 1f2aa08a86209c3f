#!/usr/bin/env bash
# Idempotent installer for everything rigbase needs on a bare Debian 12 machine:
# Debian packages for the real components the tests drive (swtpm, umockdev, miniupnpd,
# avahi, QEMU, debootstrap, PostgreSQL), then a virtual environment with the project.
# Re-running it is cheap: it installs only what is missing and re-pips only when
# pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  # TPM: software TPM with EK certificates, the TSS the minion links against
  swtpm swtpm-tools tpm2-tools libtss2-dev pkg-config gcc
  # hardware mocks that pyudev reads
  umockdev gir1.2-umockdev-1.0 libumockdev-dev libgirepository1.0-dev libcairo2-dev
  # UPnP router and an independent mDNS peer, in network namespaces
  miniupnpd miniupnpd-nftables nftables avahi-daemon socat iproute2
  # store: PostgreSQL for the second backend's tests
  postgresql
  # image builder and its boot test
  # (systemd: /lib/systemd/systemd-measure predicts PCR 11; git: the wheel is built from `git ls-files`)
  debootstrap mtools dosfstools e2fsprogs fdisk cryptsetup-bin systemd systemd-boot-efi
  binutils zstd qemu-system-x86 ovmf python3-venv git
  # Ansible's chroot connection needs nothing extra; util-linux gives unshare
  util-linux
  # the console's browser test drives headless Chromium through Debian's driver (nothing downloaded)
  chromium chromium-driver
  # job containers on the minion (minion/jobs/): rootful podman; runc for cgroups v1 hosts; catatonit for
  # `--init` so SIGTERM reaches the job's command
  podman runc catatonit
  # a private registry for the pull-credentials test (the distribution project's; htpasswd for its users)
  docker-registry apache2-utils
  # the Vagrant lab: `vagrant validate` of the top-level Vagrantfile (tests/test_vagrantfile.py)
  # (and its real `vagrant up` of one node VM: tests/image_builder/test_vagrant_up.py)
  vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu
  # the Jetson device bundle's aarch64 minion, run under user-mode emulation in an arm64 Debian tree
  # (tests/minion/test_device_bundle.py)
  qemu-user-static
  # a real Prometheus server scraping GET /metrics (tests/provisioner/test_prometheus.py)
  prometheus
  # the load balancer in front of several control-plane hosts (tests/provisioner/test_scale_out.py)
  haproxy
  # real datastore servers in a network namespace of the test, mounted by a guest booted from the image
  # (tests/image_builder/test_datastores_vm.py): userspace NFS (no kernel nfsd here) and Samba;
  # xfsprogs makes the XFS (pquota) volume that podman's hard disk quota needs
  nfs-ganesha nfs-ganesha-vfs rpcbind nfs-common samba smbclient xfsprogs
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # miniupnpd's postinst asks questions and tries to start the daemon on the host: keep it quiet
  echo "miniupnpd miniupnpd/start_daemon boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get update -qq
  # policy-rc.d keeps package scripts from starting daemons (avahi, miniupnpd) on the host's interfaces.
  # Removed by a trap, so a failed install does not leave every later daemon start on this host refused;
  # one that was already there is left alone.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.rigbase-deps
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "install-deps: pip install -e .[test]"
  .venv/bin/pip install -q --upgrade pip wheel
  .venv/bin/pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi

# Ansible collection community.general (the chroot connection that finalizes lab nodes). It ships only
# in the 54 MB `ansible` bundle wheel; keep just that collection (12 MB) inside .venv. The finalize
# runner points ANSIBLE_COLLECTIONS_PATH at .venv/ansible-collections. Bundle 12.x pairs with core 2.19.
ANSIBLE_BUNDLE='ansible>=12,<13'
coll=.venv/ansible-collections
if [[ ! -f $coll/.bundle || $(cat "$coll/.bundle") != "$ANSIBLE_BUNDLE" ]]; then
  echo "install-deps: community.general from $ANSIBLE_BUNDLE"
  dl=$(mktemp -d)
  .venv/bin/pip download -q --no-deps -d "$dl" "$ANSIBLE_BUNDLE" 2>&1 | grep -v "is ignored: it is neither" || true
  rm -rf "$coll.tmp"
  .venv/bin/python - "$dl"/ansible-*.whl "$coll.tmp" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("ansible_collections/community/general/")])
EOF
  echo "$ANSIBLE_BUNDLE" > "$coll.tmp/.bundle"
  rm -rf "$coll" "$dl"; mv "$coll.tmp" "$coll"
fi

# axe-core, the accessibility engine the console's browser tests inject into headless Chromium
# (tests/provisioner/test_console_axe.py), from the npm registry, kept inside .venv
AXE='axe-core@4.14.1'
if [[ ! -f .venv/npm/.axe || $(cat .venv/npm/.axe) != "$AXE" ]]; then
  if command -v npm >/dev/null; then
    echo "install-deps: $AXE"
    npm install --no-audit --no-fund --silent --prefix .venv/npm "$AXE"
    echo "$AXE" > .venv/npm/.axe
  else
    echo "install-deps: npm is missing, so the console's accessibility test will fail: install Node.js and npm" >&2
  fi
fi

# Azurite, Microsoft's own Azure Blob emulator, for azure:// sources and outputs through the real
# azure-storage-blob client (tests/fixtures/azurite.py). 3.35.0 is the newest that runs on Node 20.
AZURITE='azurite@3.35.0'
if [[ ! -f .venv/azurite/.version || $(cat .venv/azurite/.version) != "$AZURITE" ]]; then
  if command -v npm >/dev/null; then
    echo "install-deps: $AZURITE"
    npm install --no-audit --no-fund --silent --prefix .venv/azurite "$AZURITE"
    echo "$AZURITE" > .venv/azurite/.version
  else
    echo "install-deps: npm is missing, so the azure:// tests will fail: install Node.js and npm" >&2
  fi
fi
