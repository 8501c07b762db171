"""Train a tiny GPT-2 in your own loop with Hugging Face Accelerate, as a user's script is written; spotray's
additions are marked ``# spotray``. Runs as it is (``python accelerate_loop.py``, ``accelerate launch ...``), where
spotray's calls do nothing, or on spot::

    spotray train --script accelerate_loop.py --set run.name=acc --set checkpoint.path=s3://my-bucket -- --max-steps 40

A resume is exact: ``load_state`` brings back the model, optimizer, scheduler and every process's RNG state, and the
data order depends only on the seed and the epoch (a seedable sampler), so skipping the epoch's batches already
trained gives the batches an uninterrupted run would have trained next.
"""

import argparse
import os
import shutil

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

import spotray


def token_dataset(samples: int, seq_len: int, vocab: int) -> list[dict]:
    """Sequences of a repeating pattern: something a small model learns in a few dozen steps."""
    generator = torch.Generator().manual_seed(0)
    starts = torch.randint(0, vocab, (samples,), generator=generator)
    return [{"input_ids": ids, "labels": ids} for ids in ((starts[:, None] + torch.arange(seq_len) * 7) % vocab)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--output-dir", default="out")
    args = parser.parse_args()

    set_seed(0)
    # cpu=True where there is no GPU: else Accelerate runs each CPU process alone, outside the process group.
    accelerator = Accelerator(cpu=not torch.cuda.is_available(),
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ticks = accelerator.num_processes  # a prepared scheduler steps once per process each step
    scheduler = get_linear_schedule_with_warmup(optimizer, 5 * ticks, args.max_steps * ticks)
    # The loader's own generator: starting an epoch then draws nothing from the RNG that dropout uses (and
    # load_state restores), so that a resume is exact.
    loader: DataLoader[dict] = DataLoader(
        token_dataset(512, 32, 128),  # type: ignore[arg-type]  # torch stub: a Dataset only; a list is map-style
        batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    model, optimizer, dataloader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    ckpt_dir = os.path.join(args.output_dir, "resume")  # spotray: the run's newest checkpoint, fetched here
    step = spotray.restore(ckpt_dir, max_steps=args.max_steps) or 0  # spotray: its step; None on a first start
    if step:  # spotray
        accelerator.load_state(ckpt_dir)  # spotray
    model.train()
    while step < args.max_steps:
        epoch, trained = divmod(step, len(dataloader))
        dataloader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(dataloader, trained) if trained else dataloader
        for batch in batches:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            spotray.report(step, loss=accelerator.gather(loss.detach()).mean().item(),  # spotray
                           learning_rate=scheduler.get_last_lr()[0])
            if spotray.should_save(step):  # spotray: at the checkpoint interval, or at once on a preemption notice
                save_dir = os.path.join(args.output_dir, f"step-{step}")  # a new directory: uploads overlap training
                accelerator.save_state(save_dir)  # spotray
                spotray.commit(save_dir, step)  # spotray: returns with the previous step's upload finished
                for old in os.listdir(args.output_dir):  # spotray: keep the local copy of the newest save only
                    if old.startswith("step-") and old != f"step-{step}":
                        shutil.rmtree(os.path.join(args.output_dir, old), ignore_errors=True)
            if spotray.should_stop():  # spotray: the notice's checkpoint committed; the run resumes elsewhere
                return
            if step == args.max_steps:
                break

    accelerator.wait_for_everyone()
    accelerator.unwrap_model(model).save_pretrained(os.path.join(args.output_dir, "final"),
                                                    is_main_process=accelerator.is_main_process)


if __name__ == "__main__":
    main()
