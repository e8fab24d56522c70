"""The one stylesheet of every HTML page the harness writes: the run report, the scenario
page and the comparison page. Inlined into each page (self-contained: nothing fetched)."""

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:1200px;color:#1d2330;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ccd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:13px}td,th{border:1px solid #ccd;padding:.25rem .5rem;
text-align:left;vertical-align:top}th{background:#eef0f5}th.sort{cursor:pointer;user-select:none}
th.sort:after{content:' ⇅';color:#99a}code,.mono{font-family:ui-monospace,monospace;font-size:12px;overflow-wrap:anywhere}
.PASS,.OK,.same,.identical,.met{background:#d9f2dd}.FAIL,.STALE,.CORRUPT,.MISSING,.EXTRA,.regressed,.differs,.unmet
{background:#f9d6d5}.INCONCLUSIVE,.XPASS,.NOISY,.REBOUND,.unstable,.changed{background:#fbefc8}
.SKIPPED,.XFAIL,.UNJUDGEABLE,.nmd{background:#e6e6e6}.UNEARNED{background:#eef4e4;outline:1px dashed #7a9a5a}.ERROR{background:#f2c1f2}.muted{color:#667}
details{margin:.4rem 0}summary{cursor:pointer;color:#334}
.badge{font-weight:700;padding:.1rem .4rem;border-radius:3px}
.first{border-left:4px solid #c0392b;padding:.3rem .8rem;background:#fff5f5;margin:.5rem 0}
.grid{table-layout:fixed;width:100%}.grid td.v{text-align:center;font-weight:700;font-size:12px}
.grid th{text-align:center;font-size:11px;overflow-wrap:normal;word-break:normal;hyphens:none}
.grid th code{overflow-wrap:normal;word-break:normal;font-size:10px}.grid td:first-child,.grid th:first-child{width:14rem;
overflow-wrap:anywhere;text-align:left}table{max-width:100%}td{overflow-wrap:anywhere}
table.verdicts{width:100%}.grid th.wide{width:50%}table.verdicts td:first-child{white-space:nowrap}table.verdicts td.headline{width:70%}
details.more{margin:.2rem 0 0;font-size:12px}details.more summary{color:#556}details.more ul{margin:.2rem 0;padding-left:1.2rem}
.banner{padding:.6rem 1rem;border-radius:4px;font-weight:700;margin:.8rem 0}.banner.met{border-left:6px solid #2e7d32}
.banner.unmet{border-left:6px solid #c0392b}
table.provenance{width:100%;font-size:12px}table.provenance th{width:9rem;white-space:nowrap;background:#f4f5f8}
.plot{display:block;margin:.4rem 0;max-width:100%;height:auto;background:#fafbfd;border:1px solid #e2e4ea}.bar-pr,.mark-pr{fill:#c0392b}
.bar-floor,.mark-floor{fill:#7f8c9a}.mark-base{fill:#2c6fbb}.band{fill:#cfd8e3}.lg-pr{fill:#c0392b}
.lg-floor{fill:#7f8c9a}.drift{background:#fbe3c8}.finding{margin:.2rem 0;font-size:12px}input.filter{display:block;margin:.3rem 0;padding:.2rem .4rem;width:22rem}.notes li{color:#7a4b00}
"""


ICON = {
    "PASS": "✅",
    "PASS (no twin)": "⚪",
    "FAIL": "❌",
    "INCONCLUSIVE": "⚠️",
    "SKIPPED": "⏭️",
    "ERROR": "💥",
    "XFAIL": "🔕",
    "XPASS": "❗",
}
"""The mark shown beside each verdict in Markdown and HTML."""


REPORT_SCHEMA_VERSION = 7
"""Version of the fields of ``summary.json``, the CSVs and the matrix and comparison files,
which CI jobs parse. A change of their fields bumps it (and is listed in the docs'
changelog); the records under ``arms/`` have their own version (``harness.store.SCHEMA_VERSION``)."""
