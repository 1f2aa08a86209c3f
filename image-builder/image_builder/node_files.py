"""What rigbase adds to the Debian tree: systemd units, the banner, fstab, os-release. Plain data, so the
build plan can list it and tests can read it."""

from __future__ import annotations

from image_builder.initramfs import OS_STATE
from image_builder.node_ansible import NODE_COLLECTIONS

ESP_MOUNT = "/boot/efi"
BUNDLE_ON_ESP = "rigbase/bundle.json"

INSTALLER_UNIT = """[Unit]
Description=rigbase installer: write the OS to this node's NVMe drives
Documentation=file:/usr/share/doc/rigbase/image-builder.md
# Runs before any getty so that it alone reads the consoles while it asks. No udev-settle: the initramfs
# already probed the USB and NVMe drives, and settling costs a minute under emulation.
After=local-fs.target systemd-udevd.service
Before=getty-pre.target getty@tty1.service serial-getty@ttyS0.service rigbase-banner.service
Wants=getty-pre.target
ConditionPathExists=/etc/rigbase/boot-source

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/python3 -m image_builder.installer
StandardOutput=journal
StandardError=journal
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
"""

BANNER_UNIT = """[Unit]
Description=rigbase console banner (minion_id and requirement verdicts)
After=rigbase-installer.service systemd-pcrphase.service
Before=getty@tty1.service serial-getty@ttyS0.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c '/usr/local/bin/rigbase-banner > /run/rigbase-banner.txt 2>&1; \\
  cat /run/rigbase-banner.txt > /dev/tty1; cat /run/rigbase-banner.txt > /dev/ttyS0'

[Install]
WantedBy=multi-user.target
"""

MEASUREMENTS_UNIT = """[Unit]
Description=rigbase boot measurements on the serial console (PCRs and the firmware event log)
After=rigbase-banner.service systemd-pcrphase.service
Before=serial-getty@ttyS0.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/rigbase-measurements

[Install]
WantedBy=multi-user.target
"""

# What the minion's local finalize reads (minion settings): the shipped collections. UTF-8:
# ansible-core refuses to start under a non-UTF-8 locale, and a unit's default is the C locale.
ANSIBLE_ENV = f"Environment=RIGBASE_ANSIBLE_COLLECTIONS={NODE_COLLECTIONS} LANG=C.UTF-8"

#: The state partition's mount point, and the minion's state directory on it (`minion run`'s default),
#: where it keeps its credential and the saved finalize configuration.
STATE_DIR = "/var/lib/rigbase"
MINION_STATE_DIR = f"{STATE_DIR}/minion"

#: The metadata server's name as every GCE Linux image has it (the root is read-only: no guest agent adds
#: it); a link-local address, so the line is inert on a physical node.
HOSTS = (
    "127.0.0.1 localhost\n127.0.1.1 rigbase\n::1 localhost ip6-localhost ip6-loopback\n"
    "169.254.169.254 metadata.google.internal metadata\n"
)

#: Where a GCE VM keeps the bundle it read from the metadata server (minion gce-bundle): the state partition.
GCE_BUNDLE = f"{STATE_DIR}/bundle.json"
#: The DMI product name of every Compute Engine VM: the GCE units run there and nowhere else.
ON_GCE = "/bin/grep -qx 'Google Compute Engine' /sys/class/dmi/id/product_name"


def minion_unit(bundle: str, *, mounts: str, after: str = "", requires: str = "") -> str:
    """The minion's unit, reading its bundle from `bundle` (the USB drive's ESP, or on GCE the state
    partition's copy of the metadata server's)."""
    return f"""[Unit]
Description=rigbase minion: attested join, heartbeats and desired state
After=network-online.target rigbase-banner.service rigbase-node-config.service{after}
Wants=network-online.target
{requires}# The node credential lives on the state partition: no join from a USB boot that has not installed.
RequiresMountsFor={mounts}
ConditionPathExists={bundle}

[Service]
{ANSIBLE_ENV}
# Containers' images and layers on the scratch volume finalize mounts, not on the root's tmpfs overlay (RAM)
Environment=RIGBASE_JOBS_PODMAN_ROOT=/scratch/containers
ExecStart=/usr/local/bin/minion run --bundle {bundle}
# one line per change of state (joining, pending, refused: why, active) on the console the operator reads
StandardOutput=journal+console
StandardError=journal+console
Restart=on-failure
RestartSec=30s
# The minion pings the watchdog on every join attempt and heartbeat (minion/watchdog.py). A loop stuck in
# one call is aborted — faulthandler prints every thread's stack on the console — and restarted above.
WatchdogSec=5min

[Install]
WantedBy=multi-user.target
"""


MINION_UNIT = minion_unit(f"{ESP_MOUNT}/{BUNDLE_ON_ESP}", mounts=f"{STATE_DIR} {ESP_MOUNT}")
# On GCE (docs/gcp.md "The rigbase image on GCE"): the same minion, its bundle from the metadata server.
GCE_MINION_UNIT = minion_unit(
    GCE_BUNDLE,
    mounts=STATE_DIR,
    after=" rigbase-gce-bundle.service",
    requires="Requires=rigbase-gce-bundle.service\n",
)

# Only on Compute Engine (ExecCondition: elsewhere the unit is skipped, not failed). Retries while the
# network comes up; a VM not made by rigbase (no rigbase-bundle attribute) fails here with one line.
GCE_BUNDLE_UNIT = f"""[Unit]
Description=rigbase on GCE: the region's enrollment bundle from the instance metadata server
After=network-online.target
Wants=network-online.target
RequiresMountsFor={STATE_DIR}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecCondition={ON_GCE}
ExecStart=/usr/local/bin/minion gce-bundle --output {GCE_BUNDLE}
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
"""

#: GCE: the image's state partition is small and last; the VM's disk is as large as the operator chose.
#: Grow the partition to the end of the disk (sfdisk first moves the backup GPT to the end), then its
#: filesystem, before it is mounted. Idempotent: a partition already at the end is left as it is, and the
#: filesystem is checked and resized only while it is smaller than its partition (the first boot, or one
#: cut off mid-grow); every other boot leaves the check to systemd-fsck, which replays the journal after a
#: hard stop. Anywhere but Compute Engine it exits at once (no device dependency in the unit: on a USB boot
#: before the install there is no state partition, and waiting for one would hold local-fs back). With
#: DISK PARTNUM arguments it works on a disk image file (the builder's tests) and skips the filesystem steps.
GROW_STATE_SCRIPT = f"""#!/bin/sh
set -eu
if [ $# -eq 2 ]; then
  DISK=$1; NUM=$2; PART=""
else
  {ON_GCE} || exit 0
  LINK=/dev/disk/by-partlabel/{OS_STATE}
  for i in $(seq 900); do [ -e "$LINK" ] && break; sleep 0.1; done
  PART=$(readlink -f "$LINK")
  NAME=$(basename "$PART")
  DISK=/dev/$(basename "$(readlink -f /sys/class/block/$NAME/..)")
  NUM=$(cat /sys/class/block/$NAME/partition)
fi
sfdisk --quiet --no-reread --no-tell-kernel --relocate gpt-bak-std "$DISK"
echo ", +" | sfdisk --quiet --no-reread --no-tell-kernel -N "$NUM" "$DISK"
[ -b "$PART" ] || exit 0
partx -u -n "$NUM" "$DISK"
HEADER=$(dumpe2fs -h "$PART" 2>/dev/null || true)
BLOCKS=$(echo "$HEADER" | sed -n 's/^Block count: *//p')
BSIZE=$(echo "$HEADER" | sed -n 's/^Block size: *//p')
FS=$((${{BLOCKS:-0}} * ${{BSIZE:-0}}))
SECTORS=$(cat /sys/class/block/$NAME/size)
[ "$FS" -lt $((SECTORS * 512 - 4 * 1048576)) ] || exit 0
echo "rigbase-grow-state: growing {OS_STATE} from $((FS / 1048576)) MiB to $((SECTORS / 2048)) MiB"
rc=0
e2fsck -fp "$PART" || rc=$?
if [ "$rc" -gt 1 ]; then
  echo "rigbase-grow-state: e2fsck -p exited $rc on $PART ({OS_STATE}): repair it by hand (e2fsck -f)"
  exit 1
fi
resize2fs "$PART"
"""

GROW_STATE_UNIT = """[Unit]
Description=rigbase on GCE: grow the state partition to the boot disk's size
DefaultDependencies=no
After=systemd-udevd.service
Before=var-lib-rigbase.mount local-fs-pre.target
Wants=local-fs-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/rigbase-grow-state
StandardOutput=journal+console

[Install]
WantedBy=local-fs.target
"""

# What finalize wrote under /etc (fstab, mdadm.conf, exports, hostname) lives in the tmpfs overlay and is
# gone after a reboot: the minion re-applies the node's saved finalize configuration at every boot. Only
# ordered before the minion (no Requires=/Wants= from it): a failure here never keeps the minion from
# starting, and the minion reports it. Bounded, so a hung playbook cannot hold the minion back forever.
# After the banner: two Python programs starting at once on a slow machine (TCG) delay the minion_id the
# operator waits for, and the minion starts after the banner anyway.
NODE_CONFIG_UNIT = f"""[Unit]
Description=rigbase node configuration: re-apply the saved finalize configuration
After=local-fs.target rigbase-banner.service
RequiresMountsFor={STATE_DIR}
Before=rigbase-minion.service

[Service]
Type=oneshot
RemainAfterExit=yes
{ANSIBLE_ENV}
ExecStart=/usr/local/bin/minion finalize apply-saved --state-dir {MINION_STATE_DIR}
TimeoutStartSec=15min

[Install]
WantedBy=multi-user.target
"""

WAIT_TPM = """for i in $(seq 300); do [ -e /dev/tpmrm0 ] && break; sleep 0.1; done"""

#: `minion banner` (hardware work) when it runs; if the minion cannot start at all, a placeholder with
#: `minion id`, or failing that the same derivation from the EK certificate (SHA-256 of the EK's DER
#: SubjectPublicKeyInfo, first 32 hex) with tpm2-tools and openssl, so the operator always gets the id.
BANNER_SCRIPT = f"""#!/bin/sh
{WAIT_TPM}
export TSS2_LOG=all+none
if minion banner 2>/run/rigbase-banner.err; then exit 0; fi
echo "(minion banner failed: $(tail -n1 /run/rigbase-banner.err))"
ID=$(minion id 2>/dev/null)
if [ -z "$ID" ]; then
  ID=$(tpm2_nvread -C o 0x01c00002 2>/dev/null | openssl x509 -inform DER -pubkey -noout 2>/dev/null \\
       | openssl pkey -pubin -outform DER 2>/dev/null | sha256sum | cut -c1-32)
fi
echo
echo "==================== rigbase node ===================="
echo "MINION_ID=$ID"
echo "Add this node: provision node add --minion-id $ID"
echo "======================================================"
"""

MEASUREMENTS_SCRIPT = f"""#!/bin/sh
# One line each, so a console reader (or the boot test) can compare them with the image manifest.
{WAIT_TPM}
mountpoint -q /sys/kernel/security || mount -t securityfs securityfs /sys/kernel/security
echo "RIGBASE-BOOT-SOURCE=$(cat /etc/rigbase/boot-source 2>/dev/null)" > /dev/ttyS0
for p in 4 11 12; do
  echo "RIGBASE-PCR$p=$(cat /sys/class/tpm/tpm0/pcr-sha256/$p 2>/dev/null)" > /dev/ttyS0
done
EVENTLOG=/sys/kernel/security/tpm0/binary_bios_measurements
echo "RIGBASE-EVENTLOG=$(base64 -w0 $EVENTLOG 2>/dev/null)" > /dev/ttyS0
"""

FSTAB = f"""# The root is dm-verity (read-only) under a tmpfs overlay, set up by the initramfs.
PARTLABEL=rigbase-esp {ESP_MOUNT} vfat ro,nofail,x-systemd.device-timeout=90s 0 0
PARTLABEL={OS_STATE} /var/lib/rigbase ext4 defaults,nofail,x-systemd.device-timeout=90s 0 2
"""

# The launcher imports the minion by name after the path change (the builder itself never imports it).
MINION_LAUNCHER = """#!/usr/bin/python3
import importlib
import sys
sys.path.insert(0, "/usr/lib/rigbase/python")  # the minion's pinned dependencies win over Debian's
sys.exit(importlib.import_module("minion.cli").main())
"""

# DHCP on every wired interface, so the minion can reach the control plane (outbound only); the DNS
# servers DHCP hands out go to systemd-resolved (networkd's state files, no D-Bus needed).
DHCP_NETWORK = """[Match]
Name=en* eth*

[Network]
DHCP=yes
"""

# network-online.target waits for one link to be up, at most 20 s: a node without a link (the QEMU boot
# test runs with -nic none) boots on and the minion retries its join (Restart=on-failure). "-": a timeout is
# no failure to show in red on the console.
WAIT_ONLINE_DROPIN = """[Service]
ExecStart=
ExecStart=-/lib/systemd/systemd-networkd-wait-online --any --timeout=20
"""

# No LLMNR or mDNS responder from resolved: the minion's own mDNS (zeroconf) owns port 5353, and a node
# answers no name queries from the network.
RESOLVED_DROPIN = """[Resolve]
LLMNR=no
MulticastDNS=no
"""

#: The root is read-only: /etc/resolv.conf is a link to the stub resolver's file, which resolved writes
#: under /run (debootstrap's copy of the build host's resolver must not reach the image either).
RESOLV_CONF_LINK = "/run/systemd/resolve/stub-resolv.conf"

UNITS = {
    "rigbase-installer.service": INSTALLER_UNIT,
    "rigbase-banner.service": BANNER_UNIT,
    "rigbase-measurements.service": MEASUREMENTS_UNIT,
    "rigbase-node-config.service": NODE_CONFIG_UNIT,
    "rigbase-minion.service": MINION_UNIT,
    "rigbase-gce-bundle.service": GCE_BUNDLE_UNIT,
    "rigbase-minion-gce.service": GCE_MINION_UNIT,
}
#: Units enabled under another target than multi-user's.
EARLY_UNITS = {"rigbase-grow-state.service": (GROW_STATE_UNIT, "local-fs.target")}


def os_release(version: str) -> str:
    return (
        f'NAME="rigbase"\nPRETTY_NAME="rigbase node {version} (Debian 12 bookworm)"\nID=rigbase\n'
        f'ID_LIKE=debian\nVERSION_ID="{version}"\nIMAGE_ID=rigbase-node\nIMAGE_VERSION="{version}"\n'
        'HOME_URL="https://github.com/rigbase"\n'
    )


def files(version: str) -> dict[str, tuple[str, int]]:
    """path in the root filesystem → (content, mode)."""
    out: dict[str, tuple[str, int]] = {
        "/usr/local/bin/rigbase-banner": (BANNER_SCRIPT, 0o755),
        "/usr/local/bin/rigbase-measurements": (MEASUREMENTS_SCRIPT, 0o755),
        "/usr/local/bin/minion": (MINION_LAUNCHER, 0o755),
        "/usr/local/bin/rigbase-grow-state": (GROW_STATE_SCRIPT, 0o755),
        "/etc/fstab": (FSTAB, 0o644),
        "/etc/hostname": ("rigbase\n", 0o644),
        "/etc/hosts": (HOSTS, 0o644),
        "/etc/rigbase/image-version": (version + "\n", 0o644),
        "/etc/systemd/network/80-rigbase-dhcp.network": (DHCP_NETWORK, 0o644),
        "/etc/systemd/system/systemd-networkd-wait-online.service.d/rigbase.conf": (
            WAIT_ONLINE_DROPIN,
            0o644,
        ),
        "/etc/systemd/resolved.conf.d/rigbase.conf": (RESOLVED_DROPIN, 0o644),
    }
    for name, text in UNITS.items():
        out[f"/etc/systemd/system/{name}"] = (text, 0o644)
    for name, (text, _) in EARLY_UNITS.items():
        out[f"/etc/systemd/system/{name}"] = (text, 0o644)
    return out


def enable_links() -> dict[str, str]:
    """The symlinks `systemctl enable` would make (made directly: no chroot, no systemctl)."""
    links = {f"/etc/systemd/system/multi-user.target.wants/{n}": f"/etc/systemd/system/{n}" for n in UNITS}
    for n, (_, target) in EARLY_UNITS.items():
        links[f"/etc/systemd/system/{target}.wants/{n}"] = f"/etc/systemd/system/{n}"
    links["/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"] = (
        "/usr/lib/systemd/system/systemd-networkd.service"
    )
    links["/etc/systemd/system/sockets.target.wants/systemd-networkd.socket"] = (
        "/usr/lib/systemd/system/systemd-networkd.socket"
    )
    links["/etc/systemd/system/network-online.target.wants/systemd-networkd-wait-online.service"] = (
        "/usr/lib/systemd/system/systemd-networkd-wait-online.service"
    )
    links["/etc/systemd/system/sysinit.target.wants/systemd-resolved.service"] = (
        "/usr/lib/systemd/system/systemd-resolved.service"
    )
    links["/etc/systemd/system/dbus-org.freedesktop.resolve1.service"] = (
        "/usr/lib/systemd/system/systemd-resolved.service"
    )
    links["/etc/resolv.conf"] = RESOLV_CONF_LINK
    return links


#: Links the Debian packages' postinsts enabled that a node must not start on its own: the NFS server and
#: rpcbind listen on the network (finalize enables and starts them on a storage node, again at every boot
#: through rigbase-node-config.service), pNFS block layout is never used, and apt's timers would fetch from
#: the network for a root that is read-only and has no package lists. podman's own units (its API service
#: and socket, restart-at-boot, auto-update) would run podman on the default storage in the root's tmpfs
#: overlay beside the minion's podman (storage on /scratch): only the minion runs containers on a node.
DISABLED_LINKS: tuple[str, ...] = (
    "/etc/systemd/system/default.target.wants/podman.service",
    "/etc/systemd/system/default.target.wants/podman-restart.service",
    "/etc/systemd/system/default.target.wants/podman-auto-update.service",
    "/etc/systemd/system/sockets.target.wants/podman.socket",
    "/etc/systemd/system/timers.target.wants/podman-auto-update.timer",
    "/etc/systemd/system/multi-user.target.wants/nfs-server.service",
    "/etc/systemd/system/multi-user.target.wants/rpcbind.service",
    "/etc/systemd/system/sockets.target.wants/rpcbind.socket",
    "/etc/systemd/system/nfs-client.target.wants/nfs-blkmap.service",
    "/etc/systemd/system/timers.target.wants/apt-daily.timer",
    "/etc/systemd/system/timers.target.wants/apt-daily-upgrade.timer",
    "/etc/systemd/system/timers.target.wants/dpkg-db-backup.timer",
)

#: Directories that must exist on the read-only root (mount points).
DIRS = (ESP_MOUNT, "/var/lib/rigbase", "/etc/rigbase")
