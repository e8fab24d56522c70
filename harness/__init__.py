"""refit-harness: does a vLLM engine whose weights were replaced in place compute exactly what
a freshly started engine with the same weights computes?

The code follows the data, one way, across three processes:

    spec -> plan -> arm engines -> worker observations -> records -> judge -> report

- Parent process (the CLI):
  - ``cli/``: one module per command; the one place failures become exit codes.
  - ``orchestrate/``: execute a plan (prepare, run arms locally or on Ray, resume, reference
    cache), and the scenario x builds loop that the CLI and the pytest plugin share.
  - ``checkpoints/``: A, B and B' on disk (read, source, derived, control, perturb, tiny, zoo).
  - ``judge/``: records -> diffs -> verdicts (evaluate, diff, verdict, accuracy, throughput, exit
    codes), and the comparison of two builds' runs (crossbuild).
  - ``builds/``: vLLM builds as venvs (an overlay, a venv of its own, or vLLM compiled for the
    CPU from its source distribution).
  - ``report/``: HTML, Markdown, JSON and CSV, from an evaluation (records only).
- Arm process (one engine's lifetime, ``python -m harness.arm.process``): ``arm/`` (the arm,
  its engines, the preflight) runs the ``paths/`` (one kind of refit each), which drive the
  ``machinery/`` (the live trainer, the weight transfer, Ray placement, in-flight requests). On a
  CPU, most arms are forked from a warm interpreter that imported vLLM once
  (``arm/zygote.py``, started by ``orchestrate/forking.py``): the same program, 9-12 s sooner.
- vLLM's worker processes: ``worker/`` (the worker extension, the tensor census, the
  kernel-input recorder, the planted-bug fixtures, the vLLM plugin, vLLM's private API, and
  ``vllm_compat``, the one adapter that holds every fork between vLLM versions).
- Shared by every process (the contract between them): ``spec/`` (what to run), ``plan``,
  ``records`` and ``store`` (what arms record, versioned), ``run_dir`` (where a run's records
  and reports lie: the one owner of every file name in it), ``errors``, ``settings``, ``cache``
  (the one way to write into the shared cache),
  ``registry``, ``device``, ``tokenizer``, ``loopback``, ``safetensors_files``, ``ray_local``.

The import contracts in ``pyproject.toml`` (``lint-imports``) hold this layering.
"""
