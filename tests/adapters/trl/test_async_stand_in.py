"""The CPU stand-in server: each sampled token's log-prob is that of the distribution it was drawn from (a float64
reference from the model's logits), the endpoints TRL calls answer in vLLM's shape, and weights load and save."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import torch
from safetensors.torch import save_file

from rlguard.adapters.trl.async_stand_in import StandInServer, StateDictWeightTransfer, sample_completion
from rlguard.tasks.hf import make_tiny_llama, save_tiny_llama


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, -1), (0.7, 3)])
def test_sampled_logprobs_are_the_sampling_distributions(temperature: float, top_k: int) -> None:
    model = make_tiny_llama(seed=0).eval()
    prompt = [1, 5, 7]
    with torch.no_grad():
        tokens, logprobs = sample_completion(
            model, prompt, max_tokens=4, temperature=temperature, top_k=top_k, top_p=1.0,
            eos_token_ids=set(), generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        assert len(tokens) == len(logprobs) == 4
        logits = model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :].double()
    for row, token, logprob in zip(logits, tokens, logprobs, strict=True):
        scaled = row / temperature
        if top_k > 0:
            keep = scaled.topk(top_k).indices
            assert token in keep.tolist()
            expected = scaled[token] - torch.logsumexp(scaled[keep], 0)
        else:
            expected = scaled[token] - torch.logsumexp(scaled, 0)
        assert logprob == pytest.approx(float(expected), abs=1e-5)


def test_endpoints_and_weight_transfer(tmp_path: Path) -> None:
    model_dir = save_tiny_llama(tmp_path / "model")
    server = StandInServer(str(model_dir), max_model_len=64)
    http = ThreadingHTTPServer(("127.0.0.1", 0), server.handler())
    threading.Thread(target=http.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{http.server_address[1]}"
    try:
        assert requests.get(f"{url}/health", timeout=10).status_code == 200
        assert requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["max_model_len"] == 64
        request: dict[str, Any] = {
            "model": "m", "prompt": [1, 5], "max_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "repetition_penalty": 1.0, "n": 1, "return_token_ids": True, "logprobs": 0, "seed": 7,
        }  # fmt: skip
        choice = requests.post(f"{url}/v1/completions", json=request, timeout=30).json()["choices"][0]
        assert 1 <= len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) <= 3
        bad = requests.post(f"{url}/v1/completions", json={**request, "repetition_penalty": 1.1}, timeout=10)
        assert bad.status_code == 400 and "repetition_penalty" in bad.json()["error"]

        transfer = StateDictWeightTransfer(url, tmp_path / "w")
        transfer.init_weight_transfer()
        changed = {n: torch.full_like(p, 0.5) for n, p in server.model.named_parameters()}
        transfer.send_weights(iter(changed.items()))
        assert server.weight_loads == 1
        assert all(torch.equal(p, changed[n]) for n, p in server.model.named_parameters())
        save_file({"not.a.weight": torch.zeros(1)}, str(tmp_path / "bad.safetensors"))
        refused = requests.post(
            f"{url}/rlguard/load_weights", json={"path": str(tmp_path / "bad.safetensors")}, timeout=10
        )
        assert refused.status_code == 400 and "not.a.weight" in refused.json()["error"]
    finally:
        http.shutdown()
        http.server_close()
