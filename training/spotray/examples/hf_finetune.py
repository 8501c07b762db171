"""Train a small causal LM with the Hugging Face Trainer, as a user's script is written; spotray adds two lines
(marked). Runs as it is (``python hf_finetune.py``) or on spot (``spotray train --script hf_finetune.py``)."""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import spotray


def token_dataset(samples: int, seq_len: int, vocab: int) -> list[dict]:
    """Sequences of a repeating pattern with noise: something a small model learns in a few dozen steps."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(samples):
        start = int(torch.randint(0, vocab, (1,), generator=generator))
        ids = (start + torch.arange(seq_len) * 7) % vocab
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--output-dir", default="out")
    parser.add_argument("--fsdp", action="store_true", help="FSDP with one checkpoint file per rank (GPUs)")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    args = parser.parse_args()

    model = GPT2LMHeadModel(GPT2Config(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab_size=128,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps,
                                      per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=5,
                                      report_to="none", use_cpu=not torch.cuda.is_available(), seed=0,
                                      fsdp=args.fsdp or None,
                                      fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"} if args.fsdp else None)
    trainer = Trainer(model=model, args=training_args, train_dataset=token_dataset(512, 32, 128),
                      callbacks=[spotray.hf.SpotrayCallback()])  # spotray: 1 of 2
    trainer.train(resume_from_checkpoint=spotray.hf.resume_checkpoint())  # spotray: 2 of 2
    trainer.save_model(f"{args.output_dir}/final")


if __name__ == "__main__":
    main()
