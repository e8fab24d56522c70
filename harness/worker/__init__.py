"""Code that runs inside vLLM's worker processes: the tensor census (``census``), the
kernel-input recorder (``recorder``) and the planted-bug fixture models (``fixtures``).
It imports torch and vLLM; nothing on the parent or report side imports it."""
