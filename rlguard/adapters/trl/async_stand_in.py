"""A CPU stand-in for the vLLM server of ``AsyncGRPOTrainer``: transformers generates, weights arrive as a state dict.

>>> # python -m rlguard.adapters.trl.async_stand_in --model DIR --port 8000   (a shell)
>>> transfer = StateDictWeightTransfer("http://127.0.0.1:8000", "/tmp/weights")  # doctest: +SKIP
>>> AsyncGRPOTrainer(model=DIR, ..., weight_transfer=transfer)  # doctest: +SKIP

The endpoints TRL 1.16's rollout worker and ``VLLMClient`` call with an injected weight transfer
(``async_rollout_worker.py``, ``_generate_one_turn``; ``vllm_client.py``): ``GET /health``, ``GET /v1/models``
(``data[0].max_model_len``) and ``POST /v1/completions`` (token-id prompts, ``n=1``, answering
``choices[0].token_ids`` and ``choices[0].logprobs.token_logprobs``). Sampling is ancestral from
``softmax(logits / temperature)`` restricted to ``top_k``/``top_p``, and each token's log-prob is that of the
distribution it was drawn from (what the trainer's ratio divides by). ``repetition_penalty`` other than 1 and
``min_p`` are refused. Two more endpoints carry the weights: ``POST /rlguard/load_weights {"path"}`` copies a
safetensors state dict into the model (under the server's lock: no completion sees half of it), and ``POST
/rlguard/save_weights {"path"}`` writes the served weights (for tests that check what the server holds). The
server answers one request at a time (``ThreadingHTTPServer`` with one model lock); for smoke tests and CI, not for
throughput.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

__all__ = ["StandInServer", "StateDictWeightTransfer", "main", "sample_completion", "wait_for_server"]

_TIMEOUT_S = 60.0


def wait_for_server(url: str, timeout_s: float = _TIMEOUT_S) -> None:
    """Block until ``GET {url}/health`` answers 200; ``TimeoutError`` naming the URL after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the stand-in server at {url} did not answer /health within {timeout_s} s.")


def sample_completion(
    model: torch.nn.Module,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    eos_token_ids: set[int],
    generator: torch.Generator,
) -> tuple[list[int], list[float]]:
    """Ancestral sampling of at most ``max_tokens`` tokens after ``prompt_ids``; the token ids and each one's
    log-prob under the filtered, temperature-scaled distribution it was drawn from (vLLM's processed log-probs)."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)  # (1, T)
    tokens: list[int] = []
    logprobs: list[float] = []
    past = None
    step_input = ids
    for _ in range(max_tokens):
        out = model(input_ids=step_input, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].double() / temperature  # (V,)
        if top_k > 0:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            probs = logits.softmax(-1)
            order = probs.argsort(descending=True)
            cumulative = probs[order].cumsum(-1)
            drop = cumulative - probs[order] > top_p  # keep the smallest prefix whose mass reaches top_p
            logits[order[drop]] = float("-inf")
        log_p = logits.log_softmax(-1)
        token = int(torch.multinomial(log_p.exp(), 1, generator=generator))
        tokens.append(token)
        logprobs.append(float(log_p[token]))
        if token in eos_token_ids:
            break
        step_input = torch.tensor([[token]], dtype=torch.long)
    return tokens, logprobs


class StandInServer:
    """The model behind the endpoints (see the module). ``model_dir`` is a ``save_pretrained`` folder."""

    def __init__(self, model_dir: str, *, max_model_len: int = 512) -> None:
        from transformers import AutoModelForCausalLM

        self.model_dir = model_dir
        self.max_model_len = max_model_len
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids = set([eos] if isinstance(eos, int) else (eos or []))
        self.lock = threading.Lock()
        self.weight_loads = 0

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions``: one completion of a token-id prompt."""
        if request.get("n", 1) != 1:
            raise ValueError(f"n must be 1; got {request['n']!r}.")
        if float(request.get("repetition_penalty", 1.0)) != 1.0 or request.get("min_p") is not None:
            raise ValueError("repetition_penalty != 1 and min_p are not supported by the stand-in server.")
        prompt = request["prompt"]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise ValueError(f"prompt must be a non-empty list of token ids; got {prompt!r:.80}.")
        generator = torch.Generator().manual_seed(int(request.get("seed", 0)) % (2**63))
        with self.lock, torch.no_grad():
            tokens, logprobs = sample_completion(
                self.model,
                prompt,
                max_tokens=int(request["max_tokens"]),
                temperature=float(request.get("temperature", 1.0)),
                top_k=int(request.get("top_k", -1) or -1),
                top_p=float(request.get("top_p", 1.0)),
                eos_token_ids=self.eos_token_ids,
                generator=generator,
            )
        return {"choices": [{"token_ids": tokens, "logprobs": {"token_logprobs": logprobs}, "index": 0}]}

    def load_weights(self, path: str) -> None:
        """Copy the state dict in the safetensors file ``path`` into the model (every name must be the model's)."""
        state = load_file(path)
        with self.lock, torch.no_grad():
            params = dict(self.model.named_parameters())
            unknown = sorted(set(state) - set(params))
            if unknown:
                raise ValueError(f"weights not in the served model: {unknown[:5]}")
            for name, tensor in state.items():
                params[name].copy_(tensor)
            self.weight_loads += 1

    def save_weights(self, path: str) -> None:
        """Write the served parameters to the safetensors file ``path``."""
        with self.lock:
            save_file({n: p.detach().contiguous() for n, p in self.model.named_parameters()}, path)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this server."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # the base's name
                return

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/v1/models":
                    model = {"id": server.model_dir, "object": "model", "max_model_len": server.max_model_len}
                    self._send(200, {"object": "list", "data": [model]})
                elif self.path == "/rlguard/weight_loads":
                    self._send(200, {"weight_loads": server.weight_loads})
                else:
                    self._send(404, {"error": f"no endpoint {self.path}"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                try:
                    if self.path == "/v1/completions":
                        self._send(200, server.complete(body))
                    elif self.path == "/rlguard/load_weights":
                        server.load_weights(body["path"])
                        self._send(200, {"weight_loads": server.weight_loads})
                    elif self.path == "/rlguard/save_weights":
                        server.save_weights(body["path"])
                        self._send(200, {})
                    elif self.path in ("/pause", "/resume"):
                        self._send(200, {})
                    else:
                        self._send(404, {"error": f"no endpoint {self.path}"})
                except (ValueError, KeyError) as err:
                    self._send(400, {"error": str(err)})

        return Handler

    def serve(self, host: str, port: int) -> None:
        """Serve until interrupted."""
        ThreadingHTTPServer((host, port), self.handler()).serve_forever()


class StateDictWeightTransfer:
    """TRL's ``WeightTransferProtocol`` by state-dict copy: ``send_weights`` writes the streamed ``(name, tensor)``
    pairs to one safetensors file in ``folder`` and asks the stand-in server to load it (instead of NCCL)."""

    def __init__(self, url: str, folder: str | Path) -> None:
        self.url = url.rstrip("/")
        self.folder = Path(folder)
        self.sends = 0

    def init_weight_transfer(self) -> None:
        """Wait for the server's ``/health`` (up to a minute) and make the folder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        wait_for_server(self.url)

    def pause(self) -> None:
        """Nothing: the server loads a whole state dict under its lock."""

    def send_weights(self, iterator: Iterator[tuple[str, Tensor]]) -> None:
        state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in iterator}
        path = self.folder / "weights.safetensors"
        save_file(state, str(path))
        response = requests.post(f"{self.url}/rlguard/load_weights", json={"path": str(path)}, timeout=_TIMEOUT_S)
        response.raise_for_status()
        self.sends += 1

    def resume(self) -> None:
        """Nothing (see :meth:`pause`)."""

    def destroy(self) -> None:
        """Nothing to release."""


def main(argv: list[str] | None = None) -> None:
    """``python -m rlguard.adapters.trl.async_stand_in --model DIR [--host H] [--port P]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True, help="a save_pretrained folder (the trainer's model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=512)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    StandInServer(args.model, max_model_len=args.max_model_len).serve(args.host, args.port)


if __name__ == "__main__":
    main()
