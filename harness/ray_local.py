"""A Ray of this run's own, on loopback: shared by the parent's fan-out and the arms' Ray
engines (``LLM`` in a Ray actor, the weight-transfer trainer). Ray is imported by the caller."""

from __future__ import annotations

import os


def init_local_ray(ray, tries: int = 3, **options) -> None:
    """``ray.init`` of a Ray that belongs to this run alone, listening on loopback only.

    - ``address="local"``: always start a new instance; a bare ``ray.init()`` would join a
      ``ray start`` cluster found on the machine (or in ``RAY_ADDRESS``).
    - Node address 127.0.0.1, so that Ray's servers listen on loopback. Measured with Ray 2.60:
      ``_node_ip_address="127.0.0.1"`` alone is silently replaced by the host's address
      (``services.resolve_ip_for_localhost``), and the GCS, raylet and workers then listen on
      every interface (``::``); Ray keeps 127.0.0.1 only where it believes clusters are
      disabled (``ray_constants.ENABLE_RAY_CLUSTER``, from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``).
      With both, every Ray server of the run listens on 127.0.0.1 only. The variable is set
      only while Ray starts its daemons (they inherit it): left in our environment it would
      make any later ``ray start --address`` from this process refuse to join a cluster.
    - Token authentication: Ray >= 2.52 has it, and the installed 2.60 turns it on for a new
      local cluster unless ``RAY_AUTH_MODE`` says otherwise (it logs "Token authentication is
      enabled"). Setting ``RAY_AUTH_MODE=token`` here, after ``import ray``, breaks the driver's
      own connection ("InvalidAuthToken": measured), so the default is left to Ray.
    - Ray waits a fixed 30 s for its raylet to register (``node.py``); on a loaded machine
      (seen here at load 20 on 2 cores) the raylet can take longer and the start fails ("The
      current node timed out during startup"), so it is tried again before the run fails.
    """
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time by services.get_node_ip_address
    options = {"address": "local", "_node_ip_address": "127.0.0.1", "include_dashboard": False, **options}
    name, before = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ[name] = "0"
    try:
        for attempt in range(1, tries + 1):
            try:
                ray.init(**options)
                return
            except Exception as exc:
                ray.shutdown()
                if attempt == tries or "timed out during startup" not in str(exc):
                    raise
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
