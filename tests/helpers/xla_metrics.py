"""Counters of what XLA did: compilations, graph executions and device-to-host transfers (``torch_xla.debug.metrics``).

Tests use them through the ``xla_metrics`` fixture, which clears the counters first, or through ``XLACounters()``
where the counts must not be cleared (a callback that compares two reads, a fresh interpreter). Every read of these
metrics in the tests goes through this class.
"""


class XLACounters:
    """Reads the counters of ``torch_xla.debug.metrics`` that a training step costs."""

    @staticmethod
    def cleared() -> "XLACounters":
        """Counters that start from zero now."""
        XLACounters.clear()
        return XLACounters()

    @staticmethod
    def get(name: str) -> int:
        """How many times the metric ``name`` was recorded, once the device has finished what it was given."""
        import torch_xla.core.xla_model as xm

        # executions run asynchronously and are counted when they finish: wait for them, or the count lags
        xm.wait_device_ops()
        XLACounters.wait_for_host_copies()
        return XLACounters.value(name)

    @staticmethod
    def wait_for_host_copies() -> None:
        """Wait until the copies that Lightning's copying thread has in flight are on the host (counted), without
        handing them to their consumers: a count then does not depend on how far that thread got."""
        try:
            from pytorch_lightning.utilities.xla_host_transfers import wait_for_host_copies
        except ImportError:  # a tree without the copying thread
            return
        wait_for_host_copies()

    @staticmethod
    def value(name: str) -> int:
        """How many times the metric ``name`` was recorded so far, without waiting for the device."""
        import torch_xla.debug.metrics as met

        data = met.metric_data(name)
        return 0 if data is None else int(data[0])

    def compiles(self) -> int:
        return self.get("CompileTime")

    def executions(self) -> int:
        return self.get("ExecuteTime")

    def transfers(self) -> int:
        return self.get("TransferFromDeviceTime")

    @staticmethod
    def clear() -> None:
        import torch_xla.debug.metrics as met

        met.clear_all()
