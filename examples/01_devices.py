"""List the devices libremax can use (runs on CPU-only machines too).

    python examples/01_devices.py
"""

from max import driver


def main() -> None:
    n = driver.accelerator_count()
    print(f"accelerator_count() = {n}")
    print(f"accelerator_api()   = {driver.accelerator_api()!r}")
    specs = driver.scan_available_devices()
    print(f"scan_available_devices() = {specs}")
    for device in driver.load_devices(specs) + ([driver.CPU()] if n else []):
        kind = "host" if device.is_host else "accelerator"
        line = f"  {device!s:6} label={device.label!r} id={device.id} api={device.api!r} is_host={device.is_host} ({kind})"
        if not device.is_host:
            line += f" arch={device.architecture_name}"
        print(line)
    # The reference's own pattern for picking a device:
    device = driver.CPU() if driver.accelerator_count() == 0 else driver.Accelerator()
    print(f"Using {device} device")


if __name__ == "__main__":
    main()
