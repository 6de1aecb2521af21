"""The Trainer gives back at teardown the signal handlers it replaced, and leaves the others as they are.

1.8.6 recorded the Python-visible handler of every signal when ``fit`` started and set each one again at teardown. A
handler that native code installs during ``fit`` is invisible to ``signal.getsignal``, so teardown replaced it with
the default: libtpu installs its ``SIGPROF`` handler at its first device operation (inside ``fit`` on TorchTPU), and the
process then died of the next ``SIGPROF`` right after ``fit`` (seen with torch-tpu 0.2.0, exit status -27).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytorch_lightning

FIXED_BY = "0096-signal-connector-keeps-handlers-set-by-native-code.patch"

SCRIPT = """
import ctypes
import os
import signal

from pytorch_lightning import Callback, Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

libc = ctypes.CDLL(None, use_errno=True)
libc.signal.restype = ctypes.c_void_p
libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
SIG_IGN = 1


class NativeHandler(Callback):
    def on_train_start(self, trainer, pl_module):
        # what libtpu does at its first device operation: a handler set in C, unseen by Python's signal module
        libc.signal(signal.SIGPROF, SIG_IGN)


def own_sigusr1(signum, frame):
    pass


signal.signal(signal.SIGUSR1, own_sigusr1)
trainer = Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False,
                  enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                  callbacks=[NativeHandler()])
trainer.fit(BoringModel())
print("sigusr1 kept:", signal.getsignal(signal.SIGUSR1) is own_sigusr1, flush=True)
os.kill(os.getpid(), signal.SIGPROF)
print("alive after SIGPROF", flush=True)
"""


def test_a_handler_native_code_set_during_fit_survives_the_teardown(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PL_FAULT_TOLERANT_TRAINING", "PJRT_DEVICE")}
    # the process imports the Lightning this test imports
    source = str(Path(pytorch_lightning.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([source, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)
    # the process is not killed by the SIGPROF it ignores: the native handler is still there after `fit`
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert "sigusr1 kept: True" in proc.stdout and "alive after SIGPROF" in proc.stdout
