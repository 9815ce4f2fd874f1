#!/usr/bin/env python3
"""The KV blocks vLLM 0.33.0's own code derives for a model's config.json, on CPU, no weights.

For each model, tensor-parallel size and prefix-caching setting: the model class is built on the
meta device (vLLM's own layers, so every layer's KVCacheSpec is its own get_kv_cache_spec), the
platform's block-size update runs as the executor runs it after load_model
(Platform.update_block_size_for_backend: Mamba alignment, page padding), the engine core's layout
resolution and grouping (get_global_kv_cache_groups) run, and get_kv_cache_configs turns each
given KV memory into num_blocks.  Recorded per case: num_blocks, the groups (spec type, layer
count, block size, page size, window / Mamba mode), the scheduler and hash block sizes, or the
error vLLM raises (a model or memory vLLM refuses).

    PY kvblocks.py --models DIR --out kv_blocks.json

Deviations, each forced by the CPU machine and irrelevant to the KV cache (README):
- the checkpoint's weight quantization_config is dropped (MXFP4 / FP8 MoE kernels do not exist
  on CPU; KV cache dtype stays "auto" = the model dtype either way);
- a multimodal model is built as its language model (text_config, the text architecture): the
  vision tower has no KV cache, and vLLM's multimodal classes need torchvision, which has no
  build for the CPU torch here;
- gpt-oss: the experts' intermediate_size 2880 is set to 4096 (vLLM's CPU MoE backends refuse
  720 and 360 per rank at TP 4 and 8; checked: TP 1 and 2 derive the same KV blocks either way);
- torchvision is replaced by an import-only stub (the language model modules of Qwen3.5 import
  transformers' Qwen2-VL image processor, which imports torchvision; PyPI's torchvision has no
  build for the CPU torch 2.13 here; nothing of it runs when layers are built on meta);
- TP > 1 is one process whose tensor-parallel group reports the TP size (rank 0's layers: every
  rank has the same specs).
"""
import argparse, json, os, subprocess, sys, tempfile

GIB = 1 << 30
MEMORIES = [4 * GIB, 16 * GIB, 60 * GIB]
TPS = [1, 2, 4, 8]
MAX_MODEL_LEN = 32768
TEXT_ARCH = {  # multimodal architecture -> its language model's vLLM class
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
    "Gemma4ForConditionalGeneration": "Gemma4ForCausalLM",
    "Qwen3VLForConditionalGeneration": "Qwen3ForCausalLM",
    "Llama4ForConditionalGeneration": "Llama4ForCausalLM",
}


TORCHVISION_STUB = '''"""Import-only stand-in written by kvblocks.py (never called)."""
class _Any:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return _Any()
    def __getattr__(self, name): return _Any()
    def __mro_entries__(self, bases): return (object,)
    def __or__(self, other): return self
    __ror__ = __or__
def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Any()
__version__ = "0.0"
'''


def write_stub(tmp):
    """The torchvision stub package under tmp/stub; returns the folder to put on PYTHONPATH."""
    root = os.path.join(tmp, "stub")
    for sub in ("torchvision", "torchvision/transforms", "torchvision/transforms/v2",
                "torchvision/io", "torchvision/ops", "torchvision/models"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
        with open(os.path.join(root, sub, "__init__.py"), "w") as fh:
            fh.write(TORCHVISION_STUB)
    for mod in ("torchvision/transforms/v2/functional.py", "torchvision/transforms/functional.py"):
        with open(os.path.join(root, mod), "w") as fh:
            fh.write(TORCHVISION_STUB)
    return root


def prepare(path, tmp):
    """A config dir vLLM can build on CPU (see the deviations above); returns (dir, notes)."""
    cfg = json.load(open(path))
    notes = []
    arch = cfg["architectures"][0]
    if arch in TEXT_ARCH:
        text = dict(cfg["text_config"])
        text["architectures"] = [TEXT_ARCH[arch]]
        text.setdefault("torch_dtype", cfg.get("torch_dtype", cfg.get("dtype", "bfloat16")))
        if arch == "Qwen3VLForConditionalGeneration":
            text["model_type"] = "qwen3"  # the text stack is Qwen3's (mrope only changes RoPE)
        notes.append(f"language model only: {TEXT_ARCH[arch]} from text_config")
        cfg = text
    if cfg.get("model_type") == "gpt_oss" and cfg.get("intermediate_size") == 2880:
        # vLLM's CPU MoE backends refuse 2880 / TP experts for TP 4 and 8; expert sizes never
        # enter the KV cache (TP 1 and 2 give the same KV blocks with either size)
        cfg["intermediate_size"] = 4096
        notes.append("experts' intermediate_size 2880 -> 4096 (CPU MoE backends, TP 4/8)")
    if "quantization_config" in cfg:
        notes.append(f"weight quantization dropped: {cfg['quantization_config'].get('quant_method')}")
        del cfg["quantization_config"]
    d = os.path.join(tmp, os.path.basename(path)[:-5])
    os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return d, notes


def describe(kvc):
    out = []
    for g in kvc.kv_cache_groups:
        s = g.kv_cache_spec
        d = {"type": type(s).__name__, "layers": len(g.layer_names), "block_size": s.block_size,
             "page_size_bytes": s.page_size_bytes}
        for k in ("sliding_window", "mamba_cache_mode", "num_kv_heads", "head_size"):
            v = getattr(s, k, None)
            if v is not None:
                d[k] = v
        if hasattr(s, "real_page_size_bytes"):
            d["real_page_size_bytes"] = s.real_page_size_bytes
        out.append(d)
    return out


def one_model(cfg_dir, name, notes):
    """Runs in its own process: every (tp, prefix caching) of one model."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging, warnings
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import torch
    import vllm
    from vllm.config import (CacheConfig, ModelConfig, VllmConfig, get_layers_from_vllm_config,
                             set_current_vllm_config)
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                  resolve_kv_cache_layout)
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import (generate_scheduler_kv_cache_config,
                                             resolve_kv_cache_block_sizes)
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    rows = []
    for tp in TPS:
        for pc in (True, False):
            row = {"model": name, "tp": tp, "enable_prefix_caching": pc, "vllm": vllm.__version__,
                   "notes": notes}
            try:
                derived = ModelConfig(model=cfg_dir, skip_tokenizer_init=True).max_model_len
                mc = ModelConfig(model=cfg_dir, skip_tokenizer_init=True,
                                 max_model_len=min(MAX_MODEL_LEN, derived))
                row["max_model_len"] = mc.max_model_len
                vc = VllmConfig(model_config=mc,
                                cache_config=CacheConfig(enable_prefix_caching=pc))
                vc.parallel_config.tensor_parallel_size = tp
                heads = mc.get_num_kv_heads(vc.parallel_config)
                with set_current_vllm_config(vc):
                    if parallel_state._TP is None:
                        init_distributed_environment(
                            world_size=1, rank=0, local_rank=0, backend="gloo",
                            distributed_init_method=f"file://{tempfile.mktemp()}")
                        initialize_model_parallel(1, 1)
                    parallel_state._TP.world_size = tp  # rank 0 of a TP group of tp ranks
                    cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
                    with torch.device("meta"):
                        cls(vllm_config=vc, prefix="")
                    current_platform.update_block_size_for_backend(vc)  # as after load_model
                    layers = get_layers_from_vllm_config(vc, AttentionLayerBase)
                    specs = {k: s for k, l in layers.items()
                             if (s := l.get_kv_cache_spec(vc)) is not None}
                    backends = get_current_attn_backends(vc)
                    resolve_kv_cache_layout(
                        vc, [[m.name for m in get_supported_kv_cache_layouts(backends)]],
                        list(specs.values()))
                    groups = get_global_kv_cache_groups(vc, [specs])
                    row.update({"kv_heads_per_rank": heads,
                                "cache_block_size": vc.cache_config.block_size,
                                "mamba_block_size": vc.cache_config.mamba_block_size,
                                "mamba_cache_mode": vc.cache_config.mamba_cache_mode,
                                "mamba_page_size_padded": vc.cache_config.mamba_page_size_padded,
                                "kv_cache_layout": vc.cache_config.kv_cache_layout,
                                "layers_with_kv": len(specs), "by_memory": []})
                    for mem in MEMORIES:
                        rec = {"kv_memory_bytes": mem}
                        try:
                            kvc = get_kv_cache_configs(vc, [specs], [mem], groups)[0]
                            skvc = generate_scheduler_kv_cache_config([kvc])
                            sbs, hbs = resolve_kv_cache_block_sizes(skvc, vc)
                            rec.update({"num_blocks": kvc.num_blocks, "groups": describe(skvc),
                                        "scheduler_block_size": sbs, "hash_block_size": hbs,
                                        "tensor_bytes": sorted({t.size for t in
                                                                kvc.kv_cache_tensors})})
                        except Exception as e:  # vLLM refuses this memory: record its reason
                            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                        row["by_memory"].append(rec)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one_model(a.one[0], a.one[1], json.loads(a.one[2]))
        return 0
    tmp = tempfile.mkdtemp(prefix="vllm-kvblocks-")
    env = dict(os.environ, PYTHONPATH=write_stub(tmp))
    rows = []
    for fn in sorted(os.listdir(a.models)):
        if not fn.endswith(".json"):
            continue
        d, notes = prepare(os.path.join(a.models, fn), tmp)
        # one process per model: a model vLLM cannot build does not stop the others
        p = subprocess.run([sys.executable, __file__, "--models", a.models, "--out", a.out,
                            "--one", d, fn[:-5], json.dumps(notes)],
                           capture_output=True, text=True, env=env)
        got = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        if not got:
            got = [{"model": fn[:-5], "notes": notes,
                    "error": (p.stderr.strip().splitlines() or ["no output"])[-1][:400]}]
        rows += got
        print(fn, len(got), "rows,", sum("error" in r for r in got), "errors", flush=True)
    with open(a.out, "w") as fh:
        json.dump({"vllm": "0.33.0", "memories": MEMORIES, "tps": TPS,
                   "max_model_len_cap": MAX_MODEL_LEN, "cases": rows}, fh, indent=0)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
