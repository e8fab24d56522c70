"""The regression corpus (``regressions/``): vLLM's own fixed refit bugs re-injected as patched
builds, each run against stock vLLM; ``refit-harness run -s regressions`` prints the recall."""

from harness.settings import CORPUS_DIR
from harness.spec.regressions import RegressionsSpec


def regressions() -> RegressionsSpec:
    return RegressionsSpec(
        name="regressions",
        description="re-injected upstream vLLM refit bugs (patched builds) vs stock: the harness's recall",
        corpus=str(CORPUS_DIR),
    )
