"""A small MLP trained by a real Lightning Trainer with MsMemScopeCallback: 24 batches,
accumulate_grad_batches=2 (12 optimizer steps), log_every_n_steps=4, a validation every 6
optimizer steps' worth of batches and a checkpoint at the end. `leak` keeps a clone of each
batch's output in a list (the line marked LEAK). Prints `METRICS <json>` (what the loggers got)
and `FINDINGS <json>`."""

import json
import sys

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import Logger
except ImportError:
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import Logger

from msmemscope.integrations.lightning import MsMemScopeCallback

torch.manual_seed(0)
torch.set_num_threads(1)
KEPT = []
LEAK = sys.argv[1] == "leak"


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        if LEAK:
            KEPT.append(out.detach().clone())  # LEAK
        return torch.nn.functional.cross_entropy(out, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Recorder(Logger):
    """Keeps every logged metric."""

    def __init__(self):
        super().__init__()
        self.rows = []

    @property
    def name(self):
        return "recorder"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append({"step": step, **{k: float(v) for k, v in metrics.items()}})


def loader(n):
    data = torch.utils.data.TensorDataset(torch.randn(n * 4, 32), torch.randint(0, 8, (n * 4,)))
    return torch.utils.data.DataLoader(data, batch_size=4)


recorder = Recorder()
callback = MsMemScopeCallback(keep_steps=[3])
trainer = pl.Trainer(
    max_steps=12,
    accumulate_grad_batches=2,
    log_every_n_steps=4,
    val_check_interval=12,
    num_sanity_val_steps=0,
    accelerator="cpu",
    devices=1,
    logger=recorder,
    callbacks=[callback],
    enable_progress_bar=False,
    enable_model_summary=False,
    default_root_dir=sys.argv[2],
)
trainer.fit(Model(), loader(24), loader(2))
print("GLOBAL_STEP", trainer.global_step)
print("METRICS", json.dumps(recorder.rows))
print("FINDINGS", json.dumps(callback.findings))
# The keep request was taken by the runtime (nothing left to ask).
print("KEEP_PENDING", json.dumps(callback.tracer._keep))
