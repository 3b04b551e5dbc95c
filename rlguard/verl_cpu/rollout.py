"""A rollout for verl on CPU: Hugging Face ``generate()`` in a Ray actor, fed the actor's weights every step.

verl 0.9.1 registers only server rollouts that need a GPU (vLLM, SGLang, TensorRT-LLM). This one has the same
three parts, so verl's trainers, agent loops and weight sync drive it unchanged:

- :class:`HFRolloutServer`, one Ray actor per replica: token-in-token-out ``generate`` (sampling with verl's
  ``temperature``/``top_p``/``top_k``, the sampled tokens' log-probs, ``extra_fields["global_steps"]``) and the
  control calls verl makes on a server (sleep, wake up, abort, ...), which have nothing to do on CPU;
- :class:`HFReplica`, the replica verl's ``LLMServerManager`` builds from ``RolloutReplicaRegistry``;
- :class:`HFServerAdapter`, the rollout object in each hybrid actor worker (verl's rollout-class registry): verl's
  weight sync (``checkpoint_engine.backend=naive``) hands it the actor's full weights after every update, and it
  loads them into its replica's model, so the rollout samples from the current policy.

One replica per actor worker (``rollout.tensor_model_parallel_size=1``); the model runs in float32.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Generator
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

__all__ = ["SERVER_PREFIX", "HFReplica", "HFRolloutServer", "HFServerAdapter"]

SERVER_PREFIX = "rlguard_hf_server_"


def _server_name(replica_rank: int) -> str:
    return f"{SERVER_PREFIX}{replica_rank}"


class HFRolloutServer:
    """One rollout replica: the model at ``model_config.local_path`` in float32, generating with ``generate()``.

    Args:
        config: verl's ``RolloutConfig`` (``prompt_length``, ``response_length``, ``seed``, ...).
        model_config: verl's ``HFModelConfig`` or its ``DictConfig`` (``local_path``).
        replica_rank: this replica's rank; seeds its sampling.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        self.config = config
        self.replica_rank = replica_rank
        self.model = AutoModelForCausalLM.from_pretrained(
            omega_conf_to_dataclass(model_config).local_path, dtype=torch.float32
        ).eval()
        self.global_steps = 0
        self.weight_updates = 0
        self._draws: dict[tuple[int, ...], int] = {}  # samples drawn per prompt since the last weight update

    def _max_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        """As verl's vLLM server: ``max_tokens`` if given, else what the response and prompt budgets leave."""
        cfg = self.config
        budget = sampling_params.pop("max_tokens", sampling_params.pop("max_new_tokens", None))
        if budget is None:
            budget = min(cfg.response_length, cfg.prompt_length + cfg.response_length - prompt_len)
        return max(1, int(budget))

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> tuple[list[int], list[float]]:
        from transformers import GenerationConfig

        params = dict(sampling_params)
        max_tokens = self._max_tokens(len(prompt_ids), params)
        temperature = float(params.get("temperature", 1.0))
        top_k = int(params.get("top_k", -1))
        greedy = temperature <= 0.0
        generation = GenerationConfig(
            max_new_tokens=max_tokens,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            top_p=None if greedy else float(params.get("top_p", 1.0)),
            top_k=None if greedy or top_k <= 0 else top_k,
            eos_token_id=self.model.generation_config.eos_token_id,
            pad_token_id=self.model.generation_config.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        ids = torch.tensor([prompt_ids])  # (1, P)
        # the k-th sample of a prompt under given weights has its own seed: the same samples whatever order the
        # agent loop's concurrent requests arrive in (the samples of one prompt are exchangeable)
        key = tuple(prompt_ids)
        draw = self._draws[key] = self._draws.get(key, -1) + 1
        seed = zlib.crc32(f"{self.config.seed}/{self.replica_rank}/{self.global_steps}/{key}/{draw}".encode())
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=generation)
        tokens = out.sequences[0, ids.shape[1] :]  # (R,)
        logits = torch.stack(out.logits, dim=1)[0].float()  # (R, V), before any logits processor
        # the log-prob verl's actor computes for the token: log_softmax(logits / temperature)
        scaled = logits if greedy else logits / temperature
        log_probs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (R,)
        return tokens.tolist(), log_probs.tolist()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """verl's token-in-token-out call: the response's tokens and (if ``sampling_params["logprobs"]``) their
        log-probs; ``extra_fields["global_steps"]`` is the step of the weights that generated them."""
        if image_data is not None or video_data is not None:
            raise ValueError("the CPU rollout is text-only; got image_data or video_data (use vLLM or SGLang).")
        want_logprobs = bool(sampling_params.get("logprobs", False))
        tokens, log_probs = self._sample(list(prompt_ids), sampling_params)
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs if want_logprobs else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> int:
        """Load the actor's full weights (Hugging Face names); returns how many updates this replica has had."""
        result = self.model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        del result
        if global_steps is not None:
            self.global_steps = int(global_steps)
        self.weight_updates += 1
        self._draws.clear()
        return self.weight_updates

    async def state(self) -> dict[str, Any]:
        """The replica's weights and counters, for tests: ``{"weights", "global_steps", "weight_updates"}``."""
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return {"weights": weights, "global_steps": self.global_steps, "weight_updates": self.weight_updates}

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = int(global_steps)

    async def abort_all_requests(self, **kwargs: Any) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, **kwargs: Any) -> dict[str, Any]:
        return {"aborted": False, "request_id": request_id}

    # memory, cache and profiling controls: nothing to free or record on CPU
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):  # type: ignore[misc]  # verl's class, untyped
    """verl's rollout replica for :class:`HFRolloutServer`: one Ray actor named ``rlguard_hf_server_<rank>``."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(
                "the CPU rollout runs one replica per actor worker: set actor_rollout_ref.rollout."
                "tensor_model_parallel_size=1 (and data/pipeline_model_parallel_size=1); got a replica world size "
                f"of {self.world_size}."
            )
        server_cls: Any = ray.remote(HFRolloutServer)
        server = server_cls.options(
            name=_server_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.state.remote()  # wait until the model is loaded
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf-cpu-replica-{self.replica_rank}"


class HFServerAdapter(BaseRollout):  # type: ignore[misc]  # verl's class, untyped
    """The rollout in a hybrid actor worker: passes the actor's weights to its replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank if replica_rank == -1 else replica_rank  # one replica per worker
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(_server_name(self.replica_rank))
        return self._server

    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        """Gather the full weights (every rank iterates: FSDP's ``full_tensor`` is a collective) and load them into
        this worker's replica; ``kwargs["global_steps"]`` is the step they come from."""
        if wire_format != "named_tensors":
            raise ValueError(
                f"the CPU rollout takes full weights (wire_format='named_tensors'); got {wire_format!r}: set "
                "actor_rollout_ref.rollout.checkpoint_engine.backend=naive."
            )
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        await self._server_handle().update_weights.remote(state, kwargs.get("global_steps"))

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None
