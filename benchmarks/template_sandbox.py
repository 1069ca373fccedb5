"""What rendering a chat template in the sandbox's child process costs against rendering it in this process.

Every template but the built-in ChatML is rendered in a child process under a time and a memory limit
(`worker.engine.template_sandbox`), one request per conversation (its text and the prefixes that find its
assistant turns). This renders the same conversations, chat-shaped like the built-in sample's (one to three
exchanges, some with a system turn), both ways, best of ``--rounds``: in this process with transformers'
own rendering (the baseline), and through the sandbox as a dataset's build does. It also times the whole
encoding of the conversations (`encode_examples`: rendering, finding the answers, tokenizing) through the
sandbox, to show the share of a build the sandbox's round trips take.

The last line is one JSON object: ``{"conversations", "renders", "in_process_s", "sandbox_s", "ratio",
"overhead_ms_per_conversation", "encode_s", "sandbox_share_of_encode"}``; ``ratio`` is the sandbox's time over
the baseline's in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from worker.engine.chat import chat_tokenizer, render_many
from worker.engine.examples import encode_examples
from worker.engine.template_sandbox import render_here
from worker.engine.tokenizer import train_tokenizer

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '### ' + m['role'] + '\\n' + m['content'] + '\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '### assistant\\n' }}{% endif %}")


def conversations(n: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    found = []
    for _ in range(n):
        turns = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}] \
            if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 3)):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            turns += [{"role": "user", "content": f"What is {a} + {b}?"},
                      {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]
        found.append(turns)
    return found


def renders_of(messages: list[dict[str, str]]) -> list[tuple[list[dict[str, str]], bool]]:
    """What finding a conversation's answers renders (`worker.engine.chat.answer_spans`)."""
    renders = [(messages, False)]
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            renders += [(messages[:index], True)] * bool(index) + [(messages[: index + 1], False)]
    return renders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200 conversations, 2 rounds")
    args = parser.parse_args()
    n, rounds = (200, 2) if args.quick else (args.conversations, args.rounds)
    chats = conversations(n, seed=0)
    corpus = "".join(m["content"] + "\n" for chat in chats[:200] for m in chat)
    bpe: Tokenizer = train_tokenizer(corpus, vocab_size=512)
    chat = chat_tokenizer(PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>"),
                          template=TEMPLATE)  # starts the sandbox and checks the template
    tokens = dict(chat.special_tokens_map)
    work = [renders_of(messages) for messages in chats]

    in_process = sandbox = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        here = [[render_here(TEMPLATE, tokens, m, add_generation_prompt=agp) for m, agp in renders]
                for renders in work]
        in_process = min(in_process, time.perf_counter() - start)
        start = time.perf_counter()
        there = [render_many(chat, renders) for renders in work]
        sandbox = min(sandbox, time.perf_counter() - start)
        assert here == there
    start = time.perf_counter()
    encoded = encode_examples(chat, [(k, None, messages) for k, messages in enumerate(chats)])
    encode = time.perf_counter() - start
    assert len(encoded.lines) == n
    print(json.dumps({
        "conversations": n, "renders": sum(map(len, work)), "in_process_s": round(in_process, 4),
        "sandbox_s": round(sandbox, 4), "ratio": round(sandbox / in_process, 2),
        "overhead_ms_per_conversation": round((sandbox - in_process) / n * 1000, 3), "encode_s": round(encode, 4),
        "sandbox_share_of_encode": round((sandbox - in_process) / encode, 3)}))


if __name__ == "__main__":
    main()
