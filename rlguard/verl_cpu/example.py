"""A verl run that fits on a laptop CPU: a tiny random Llama, a character tokenizer, "a+b=" prompts, a reward.

:func:`write_example` writes into a folder what ``python -m verl.trainer.main_ppo`` reads: the model and tokenizer
(``model/``: :func:`rlguard.tasks.hf.make_tiny_llama` after a short warm start, and its tokenizer with a chat template
that passes the prompt through),
``train.parquet`` and ``val.parquet`` in verl's RL dataset layout, and returns the overrides that point verl at
them. :func:`compute_score` is the reward (``custom_reward_function.path`` is this file):
:meth:`rlguard.tasks.tiny.AdditionTask.reward`, 1 for the exact sum, partial credit for its digits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "compute_score", "example_overrides", "write_example"]

# verl's agent loop tokenizes prompts with the chat template; the tiny model's "chat" is the bare prompt after <bos>
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
DATA_SOURCE = "rlguard/addition"


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any
) -> float:
    """verl's ``custom_reward_function``: :meth:`AdditionTask.reward` of the decoded response."""
    from rlguard.tasks.tiny import AdditionTask

    if data_source != DATA_SOURCE:
        raise ValueError(f"compute_score scores data_source {DATA_SOURCE!r}; got {data_source!r}.")
    return AdditionTask().reward(solution_str.strip(), int(ground_truth))


def _rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    from rlguard.tasks.tiny import AdditionTask

    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": i},
        }
        for i, (prompt, answer) in enumerate(AdditionTask().prompts(n, seed))
    ]


def write_example(
    folder: str | Path, *, n_train: int = 64, n_val: int = 8, seed: int = 0, warm_start_steps: int = 40
) -> Path:
    """Write ``model/``, ``train.parquet`` and ``val.parquet`` into ``folder`` (created if missing); return it.

    The model gets ``warm_start_steps`` supervised steps on correct sums first (:func:`rlguard.tasks.hf.warm_start`,
    a few seconds): a random model almost never earns a reward, so most GRPO groups would have zero advantages.
    """
    from datasets import Dataset

    from rlguard.tasks.hf import make_tiny_llama, make_tokenizer, warm_start

    out = Path(folder)
    model = make_tiny_llama(seed)
    warm_start(model, steps=warm_start_steps, seed=seed)
    model.save_pretrained(out / "model")
    tokenizer = make_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out / "model")
    Dataset.from_list(_rows(n_train, seed, "train")).to_parquet(str(out / "train.parquet"))
    Dataset.from_list(_rows(n_val, seed + 1, "val")).to_parquet(str(out / "val.parquet"))
    return out


def example_overrides(folder: str | Path) -> list[str]:
    """verl overrides that train :func:`write_example`'s model on its data with :func:`compute_score`: GRPO, 4
    prompts x 4 samples per step, prompts of at most 8 tokens and responses of at most 4, no validation."""
    out = Path(folder).absolute()
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={out / 'train.parquet'}",
        f"data.val_files={out / 'val.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=8",
        "data.max_response_length=4",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={out / 'model'}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "algorithm.use_kl_in_reward=false",
        f"reward.custom_reward_function.path={Path(__file__).absolute()}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=rlguard_cpu",
        "trainer.experiment_name=tiny",
    ]
