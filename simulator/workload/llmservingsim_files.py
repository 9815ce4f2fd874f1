"""The public files of LLMServingSim's two Llama-3.1-8B validation runs (operator profile
bundles of the RTX 4090 and RTX PRO 6000, the real vLLM 0.19 runs, the workload replayed), as
``servesim fetch llmservingsim`` downloads them into ``data/llmservingsim/`` (the layout the
``real-*`` scenarios read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_F = TypeVar("_F")

GROUP = "llmservingsim"
REPO = "casys-kaist/LLMServingSim"
COMMIT = "5daddb21a545658d5150b535712d0494584b5278"
LICENSE = "MIT"

_BUNDLE = "profiler/perf/{gpu}/meta-llama/Llama-3.1-8B/bf16"
_RUN = "bench/examples/{gpu}/Llama-3.1-8B"

FILES: tuple[tuple[str, str, int, str], ...] = (  # noqa: E501 (the checksums do not wrap)
    # (destination under data/llmservingsim/, upstream path, size, sha256)
    *(
        (f"profiles/{g}/Llama-3.1-8B/{f}", f"{_BUNDLE.format(gpu=g)}/{f}", size, sha)
        for g, f, size, sha in (
            (
                "RTX4090",
                "meta.yaml",
                1063,
                "9c99dc484f44f965e7cdb95767706973588b1462a20332ee6430767433732deb",
            ),
            (
                "RTX4090",
                "tp1/attention.csv",
                204129,
                "60f0669b5e85467b18d0ca241a826c4376c530b22b74b7b20748a1955cf61949",
            ),
            (
                "RTX4090",
                "tp1/dense.csv",
                31680,
                "4f5b0623f1fa27033752cc54807a4089c39205c7132a0bb196520249d9d9140a",
            ),
            (
                "RTX4090",
                "tp1/per_sequence.csv",
                1609,
                "acbc8294d6749cb3ed8eaccb9ab561e62cacf9fbc06e6901c89646d750d94647",
            ),
            (
                "RTX4090",
                "tp1/skew_fit.csv",
                169561,
                "ac3391e1b764ed61b7e4c479c74bd35b0c949066c0b08ecc5f5fba75a9dc3b87",
            ),
            (
                "RTXPRO6000",
                "meta.yaml",
                2329,
                "01c964ad3e8ce9604773e7c0b3ae815c22545385d789842a920d8f33b1ce8b98",
            ),
            (
                "RTXPRO6000",
                "tp1/attention.csv",
                469632,
                "dd802390245b2c215a491b78c390482fbc6e49afc760182d7ce15fddff369175",
            ),
            (
                "RTXPRO6000",
                "tp1/dense.csv",
                31587,
                "6f23be95325a16544319b78c477d71bec8996fdc826ae55140c36f36e17973c4",
            ),
            (
                "RTXPRO6000",
                "tp1/per_sequence.csv",
                1606,
                "af9abb35ef5eb7c98e1856fa5fe5090008d8b98f1b6278b6d081577451d9c618",
            ),
            (
                "RTXPRO6000",
                "tp1/skew_fit.csv",
                169491,
                "89e8f8ffba2f8968485cd11d0ac9fd50b5b2bf2593bd73e326b81a2e5958c8c3",
            ),
            (
                "RTXPRO6000",
                "tp2/attention.csv",
                469185,
                "d6231d664ba021c5b21f157adc815cc8afe7f52b3eb6e4f855a54386b448627d",
            ),
            (
                "RTXPRO6000",
                "tp2/dense.csv",
                31522,
                "5f1c12baadd49a4f82cd3a9648724d2fc4fea954eb8d9c2e650afe03e3c3d53b",
            ),
            (
                "RTXPRO6000",
                "tp2/per_sequence.csv",
                1608,
                "d1581678297ef0fe2d649608ed33805fb76a4d96c7766972e8b3f3bbee02a2c1",
            ),
            (
                "RTXPRO6000",
                "tp2/skew_fit.csv",
                168944,
                "7cd42482760299445e3e47024d3c71c8b04e6a9a51a36506dc60002f288685c2",
            ),
        )
    ),
    *(
        (f"runs/{g}/Llama-3.1-8B/{f}", f"{_RUN.format(gpu=g)}/{up}", size, sha)
        for g, f, up, size, sha in (
            (
                "RTX4090",
                "meta.json",
                "vllm/meta.json",
                11764,
                "56cbcb2a08e9fe6f67d60cad8ee545f86c874f82b46ab413da484f331417b2fc",
            ),
            (
                "RTX4090",
                "requests.jsonl",
                "vllm/requests.jsonl",
                70259,
                "5a6f2a0b09d5eb84bd75b30ed625d883c22b4bcc0a839cd1128ae42f74ecc90d",
            ),
            (
                "RTX4090",
                "timeseries.csv",
                "vllm/timeseries.csv",
                5656,
                "f99d474f8d8a2c52f986fb27e46832a1627fc908d7570852b016573b89ab3173",
            ),
            (
                "RTX4090",
                "llmservingsim_summary.txt",
                "validation/summary.txt",
                1022,
                "80c1b498f741d798e705fc83dfe79394cabee41eb18cfba6957ae17f01062f25",
            ),
            (
                "RTXPRO6000",
                "meta.json",
                "vllm/meta.json",
                708,
                "c074b29bddabe66102e3e635dd7910c35927c3f52b73d58d8fa0798f38156ae4",
            ),
            (
                "RTXPRO6000",
                "requests.jsonl",
                "vllm/requests.jsonl",
                71451,
                "0175b31b0ddc02b97eb6da1410dc80fc5900b8785c988e90cacee1021d644682",
            ),
            (
                "RTXPRO6000",
                "timeseries.csv",
                "vllm/timeseries.csv",
                2003,
                "de884551204aeb9c12d8bed0fa78a5eb6b85e1e0bb173e9664fd6e5f26998aed",
            ),
            (
                "RTXPRO6000",
                "llmservingsim_summary.txt",
                "validation/summary.txt",
                1022,
                "40dbb4ac3fa2c1c1e0f65891b914de2af245192ef04e9ca25a74a3c5132a13c5",
            ),
        )
    ),
    (
        "sharegpt-llama-3.1-8b-300-sps10.jsonl",
        "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl",
        2574379,
        "05e48b32da530d4a3dd77f3d47c6fe694ac8308d611aa088e38bb10fba2b3b3a",
    ),
    # what the files mean, in LLMServingSim's words: the profile bundle's format, the bench
    # runs and the workloads
    (
        "profile-format.md",
        "docs/docs/profiler/output-bundle.md",
        13668,
        "01f5c83df7703afdd10c226996786cba902e6a952c93d355c180623818e804c7",
    ),
    (
        "bench-README.md",
        "bench/README.md",
        9190,
        "f75245d4836679aff6e43ff7189f91e7aecc20b60ea5317d502fe6e56b96c654",
    ),
    (
        "workloads-README.md",
        "workloads/README.md",
        6673,
        "cac55bce0e393eb51ccdb0d4924a1023b8bc7cf8b1166da709372f50f2cb99c6",
    ),
)
"""Every file: where it is saved, where it comes from, its size and sha256 (those of the
byte-exact copies in ../shared/data/llmservingsim, SOURCES.txt)."""


def entries(make: Callable[..., _F]) -> list[_F]:
    """The registry entries (``make`` is ``datasets.DataFile``): named ``llmservingsim:`` and
    their destination, saved under ``llmservingsim/``."""
    return [
        make(
            name=f"{GROUP}:{dest}",
            group=GROUP,
            repo=REPO,
            commit=COMMIT,
            path=path,
            size=size,
            sha256=sha,
            dest=f"{GROUP}/{dest}",
            license=LICENSE,
        )
        for dest, path, size, sha in FILES
    ]
