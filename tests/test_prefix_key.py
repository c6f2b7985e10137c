"""prefix-hash's key as KubeAI builds it: a completions prompt's head, a chat's first user message."""

from __future__ import annotations

import numpy as np

from servelab.workload.datasets import WorkloadConfig, open_dataset
from servelab.workload.routing import HASH_PREFIX_TOKENS, prefix_key


def test_a_chat_is_keyed_past_its_system_prompt_on_its_first_user_message():
    system, first, second = np.arange(100, 400), np.arange(1000, 1050), np.arange(2000, 2050)
    turn_one = np.concatenate([system, first])
    turn_two = np.concatenate([system, first, np.arange(5000, 5010), second])
    other_chat = np.concatenate([system, second])
    key = prefix_key(turn_one, len(system))
    assert key == prefix_key(turn_two, len(system))  # every turn of a chat on one key
    assert key != prefix_key(other_chat, len(system))  # chats sharing a system prompt on their own keys
    assert prefix_key(turn_one) == prefix_key(other_chat)  # a completions prompt: its head, the shared prompt
    assert len(key) == HASH_PREFIX_TOKENS * 8


def test_multiturn_requests_carry_the_length_of_the_system_prompt_they_open_with():
    config = WorkloadConfig(
        dataset_name="multiturn", turns=3, prefix_len=64, num_prefixes=2, input_len=32, output_len=8, seed=1
    )
    specs = list(open_dataset(config, np.random.default_rng(1)).specs(12))
    assert {s.system_len for s in specs} == {64}
    assert len({prefix_key(s.prompt_ids, s.system_len) for s in specs}) == len({s.conversation for s in specs})
