"""A tiny GPT-2 (from config) trained by a real transformers.Trainer with MsMemScopeCallback:
24 micro-batches, gradient accumulation 2 (12 optimizer steps), logging every 4 steps, an
evaluation and a checkpoint every 6. `leak` keeps a clone of each micro-batch's logits in a
list (the line marked LEAK). Prints `LOG_HISTORY <json>` and `FINDINGS <json>`."""

import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from msmemscope.integrations.transformers import MsMemScopeCallback

torch.manual_seed(0)
torch.set_num_threads(1)
KEPT = []


def keep_logits(module, inputs, output):
    KEPT.append(output.logits.detach().clone())  # LEAK


model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32))
if sys.argv[1] == "leak":
    model.register_forward_hook(keep_logits)


def sample(i):
    ids = torch.randint(0, 100, (16,))
    return {"input_ids": ids, "labels": ids}


train = [sample(i) for i in range(48)]
evaluation = [sample(i) for i in range(4)]
args = TrainingArguments(
    output_dir=sys.argv[2],
    max_steps=12,
    per_device_train_batch_size=2,
    per_device_eval_batch_size=2,
    gradient_accumulation_steps=2,
    logging_steps=4,
    eval_strategy="steps",
    eval_steps=6,
    save_strategy="steps",
    save_steps=6,
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    dataloader_num_workers=0,
)
callback = MsMemScopeCallback(keep_steps=[3])
trainer = Trainer(
    model=model, args=args, train_dataset=train, eval_dataset=evaluation, callbacks=[callback]
)
trainer.train()
print("GLOBAL_STEP", trainer.state.global_step)
print("LOG_HISTORY", json.dumps(trainer.state.log_history))
print("FINDINGS", json.dumps(callback.findings))
# The keep request was taken by the runtime (nothing left to ask).
print("KEEP_PENDING", json.dumps(callback.tracer._keep))
