"""Beam-search decoding speed of a trained model on a test set, in fp32 and bf16 (§6.1: beam 4).

The pipeline's own translator (``pipeline.serving.translator``, the evaluate stage's) decodes every
sentence of ``--sources`` with the beam, alpha and stopping rule the tune stage chose on val
(``--tune``), in batches of ``--batch-sentences``, once untimed (CUDA kernels and allocator warmed
up) and then ``--rounds`` times timed; the figure is sentences per second over the median round,
with the BLEU of the output (so that a fast but broken precision shows). bf16 casts the weights
once (``precision: bf16``).

    python -m bench.gpu.decode --workspace DIR [--device cuda] [--batch-sentences 64 256] [--rounds 3]

``DIR`` is a recipe's workspace (``bench.gpu.recipes``): its ``models/model.pt``, ``reports/tune.json``
and ``data/``. The last line is ``ratio=<bf16 / fp32 sentences/s>`` at the first batch size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import sacrebleu
import torch
import yaml

from pipeline.config.decoding import DecodingConfig
from pipeline.data.text_files import read_lines
from pipeline.serving.translator import load_translator


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-sentences", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-sentences", type=int, default=0, help="the first N test sentences (0 = all)")
    args = parser.parse_args()
    ws = args.workspace
    params = yaml.safe_load((ws / "params.yaml").read_text())
    data = params["data"]
    test_set = data["test_sets"][0]
    sources = read_lines(ws / "data" / "corpus" / f"{test_set}.{data['src_lang']}")
    references = read_lines(ws / "data" / "corpus" / f"{test_set}.{data['tgt_lang']}")
    if args.max_sentences:
        sources, references = sources[:args.max_sentences], references[:args.max_sentences]
    chosen = json.loads((ws / "reports" / "tune.json").read_text())["chosen"]
    stopping = chosen.get("stopping", "exact")   # tune reports from before the rule was tuned: the exact rule
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{test_set}: {len(sources)} sentences, beam {chosen['beam_size']}, alpha {chosen['alpha']}, "
          f"stopping {stopping} (tune's choice on val), max_len_b {params['evaluate']['max_len_b']}, on {name}, "
          f"torch {torch.__version__}")
    rates: dict[tuple[str, int], float] = {}
    for precision in ("fp32", "bf16"):
        for batch in args.batch_sentences:
            decoding = DecodingConfig(beam_size=chosen["beam_size"], alpha=chosen["alpha"],
                                      max_len_b=params["evaluate"]["max_len_b"], batch_sentences=batch,
                                      precision=precision, stopping=stopping)
            translator = load_translator(ws / "models" / "model.pt", ws / "data" / "tokenizer" / "spm.model",
                                         decoding, device)
            hypotheses = translator.translate(sources)   # untimed: kernels chosen, allocator warmed
            seconds = []
            for _ in range(args.rounds):
                _sync(device)
                start = time.perf_counter()
                hypotheses = translator.translate(sources)
                _sync(device)
                seconds.append(time.perf_counter() - start)
            rates[(precision, batch)] = len(sources) / statistics.median(seconds)
            bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
            print(f"{precision} batch {batch}: {rates[(precision, batch)]:,.1f} sentences/s (median of "
                  f"{args.rounds}: {statistics.median(seconds):.2f} s), BLEU {bleu:.2f}", flush=True)
            del translator
    first = args.batch_sentences[0]
    print(f"ratio={rates[('bf16', first)] / rates[('fp32', first)]:.2f}")


if __name__ == "__main__":
    main()
