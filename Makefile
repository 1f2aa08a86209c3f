# The two set-up commands of the README are `make demo` and `make test`; both install what
# they need first (scripts/install-deps.sh is idempotent: apt for real components, pip into .venv).
PY := .venv/bin/python
export TSS2_LOG := all+none
# one debootstrap'd lab root for the finalize and lab tests, kept between runs (keyed by its inputs)
export RIGBASE_TEST_ROOTFS_CACHE ?= $(CURDIR)/.cache/rootfs

.PHONY: deps test test-deep test-vm test-vagrant test-nvidia demo bench clean

deps:
	./scripts/install-deps.sh

test: deps
	./scripts/run-tests.sh

# what is too slow for `make test`: the API fuzz at 150 examples per operation (docs/testing.md)
test-deep: deps
	RIGBASE_FUZZ_EXAMPLES=150 $(PY) -m pytest -q tests/provisioner/test_fuzz_api.py

# a node's whole life in QEMU under TCG, from the USB image to active and through a reset, and a GCE VM
# joining and then refused: about 13 min on an idle 2-core machine, three times that beside other work
# (docs/testing.md)
test-vm: deps
	$(PY) -m pytest -q --durations=5 -p no:cacheprovider tests/image_builder/test_node_life_vm.py

# a Vagrant VM (libvirt, TCG) installs from the USB image, joins the control plane on the host, finalizes
# and goes into maintenance; libvirtd in a network namespace of the test (docs/vagrant.md, "Tested here")
test-vagrant: deps
	$(PY) -m pytest -q --durations=5 -p no:cacheprovider tests/image_builder/test_vagrant_join.py

# an image built --with-nvidia: Debian's driver at its pinned version, its modules compiled by DKMS for the
# image's own kernel, read back with modinfo (docs/image-builder.md, "The NVIDIA driver"; docs/testing.md)
test-nvidia: deps
	$(PY) -m pytest -q -s --durations=5 -p no:cacheprovider tests/image_builder/test_nvidia_image.py

demo: deps
	./scripts/demo.sh

# the bench extra: py-spy, which samples where the server's time goes in bench fleet_heartbeats
bench: deps
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench

clean:
	rm -rf .venv build dist *.egg-info .pytest_cache
