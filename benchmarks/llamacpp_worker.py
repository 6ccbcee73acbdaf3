"""llama.cpp's side of benchmarks/llamacpp_compare.py, run by the Python of llama-cpp-python's own
virtualenv (no rollway, no torch there).

Usage: python llamacpp_worker.py GGUF N_THREADS N_CTX. It prints one JSON line once the model is
loaded, then answers each JSON line on stdin, {"prompts": [[ids]], "max_tokens": n,
"stop_ids": [ids]}, with one line {"outputs": [{"ids": [...], "logprobs": [...]}]}: greedy,
one prompt after another (a Llama object serves one request at a time), each sampled token's
logprob the log-softmax of its logits, as rollway's engine reports it.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from llama_cpp import Llama


def generate(llm: Llama, prompt: list[int], max_tokens: int, stop_ids: set[int]) -> dict:
    ids: list[int] = []
    logprobs: list[float] = []
    # Llama.generate keeps the KV of the prompt prefix it shares with the previous request.
    for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0):
        # The logits that chose ``token``: the last row of the last forward pass.
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
        top = logits.max()
        log_norm = top + np.log(np.exp(logits - top).sum())
        ids.append(int(token))
        logprobs.append(float(logits[token] - log_norm))
        if token in stop_ids or len(ids) >= max_tokens:
            break
    return {"ids": ids, "logprobs": logprobs}


def main() -> None:
    gguf, n_threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    llm = Llama(gguf, n_threads=n_threads, n_threads_batch=n_threads, n_ctx=n_ctx, verbose=False)
    print(json.dumps({"ready": True, "n_threads": llm.n_threads}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        stop_ids = set(request["stop_ids"])
        outputs = [generate(llm, p, request["max_tokens"], stop_ids) for p in request["prompts"]]
        print(json.dumps({"outputs": outputs}), flush=True)


if __name__ == "__main__":
    main()
