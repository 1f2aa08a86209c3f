"""What NVML, NVIDIA's own library (nvidia-ml-py), says about the loaded driver and its GPUs, for the CDI
spec (minion/gpu/driver.py); without the driver or the library, nothing (the spec then reads the root)."""

from __future__ import annotations

from minion.gpu.driver import Gpu, NvmlView, sysfs_bus_id


def driver_view() -> NvmlView | None:
    """The loaded driver's version and its GPUs (index, minor number, UUID, bus id); None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            gpus.append(
                Gpu(
                    index=index,
                    minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    pci_bus_id=sysfs_bus_id(bus.decode() if isinstance(bus, bytes) else str(bus)),
                )
            )
        return NvmlView(version.decode() if isinstance(version, bytes) else str(version), tuple(gpus))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
