"""The `seq2onnx serve` app as a Ray Serve deployment: N replicas, each with its own engine.

Each replica is one Ray actor that loads the bundle into its own Translator, starts its own engine
(a continuous batcher by default, `batching="request"` for the per-request baseline) and serves the
very FastAPI app that `seq2onnx serve` serves (serve/app.py's create_app). Ray Serve's HTTP proxy
routes each request to one replica (power of two choices on the replicas' ongoing requests), and
its controller replaces a replica whose actor dies or whose health check fails.

How the app is wrapped: `serve.ingress()` with no app and a class that defines
`__serve_build_asgi_app__` (Ray's late-bound ingress, Ray >= 2.56): Ray calls it in the replica after
the constructor, so the app is built around the engine the replica made, and nothing unpicklable
(a Translator, a thread pool) crosses from the driver. Ray runs the app's lifespan as uvicorn would.

Every response carries `X-Replica: <replica tag>` (the tag of Ray's replica id), so the spread of
requests over the replicas is visible to a client. docs/serving-ray.md has the multi-node start and
what happens to the requests of a replica that dies.

    python -m seq2onnx.serve.ray_deploy BUNDLE --replicas 2 --port 8000            # a local Ray
    python -m seq2onnx.serve.ray_deploy BUNDLE --replicas 8 --address auto         # a running cluster

Ray is imported inside functions: this module is importable (and its Replica testable) without it.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import signal
import sys
import threading
from pathlib import Path

#: the Serve application's and the deployment's names (serve.status(), the replicas' actor names)
APP_NAME = "seq2onnx"
DEPLOYMENT_NAME = "Translator"
BATCHINGS = ("continuous", "request")
#: the first Ray whose serve.ingress() takes no app and calls __serve_build_asgi_app__ (2.55 has neither)
MIN_RAY = (2, 56)


class ReplicaHeader:
    """ASGI middleware that names the replica on every HTTP response (`X-Replica`).

    Pure ASGI rather than a Starlette BaseHTTPMiddleware: it must not buffer the streaming endpoint.

    Args:
        app: the ASGI app wrapped.
        name: the replica's name, sent as the header's value.
    """

    def __init__(self, app, name: str):
        self.app = app
        self.value = name.encode("latin-1")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-replica", self.value)]}
            await send(message)

        await self.app(scope, receive, send_named)


class Replica:
    """One replica: a Translator, an engine and the app built around them (Ray calls the methods).

    Args:
        bundle: the bundle directory (the same absolute path on every node).
        batching: "continuous" (serve/batcher.py's ContinuousEngine) or "request" (RequestEngine).
        device: the Translator's device ("cpu", "cuda", "auto").
        threads: onnxruntime intra-op threads (the replica reserves as many CPUs from Ray).
        workers: requests decoded at once by the request engine (unused by the continuous one).
        limits: create_app's keyword limits (max_queue, max_texts, ...).
    """

    def __init__(self, bundle: str, batching: str, device: str, threads: int, workers: int, limits: dict):
        from seq2onnx.runtime.translator import Translator

        self.translator = Translator(bundle, device=device, intra_threads=threads)
        if batching == "continuous":
            from seq2onnx.serve.batcher import ContinuousEngine

            self.engine = ContinuousEngine(self.translator)
        else:
            from seq2onnx.serve.engine import RequestEngine

            self.engine = RequestEngine(self.translator, workers=workers)
        self.limits = dict(limits)
        self.replica_name = _replica_name()

    def __serve_build_asgi_app__(self):
        """Returns the FastAPI app of this replica's engine, with the X-Replica header added."""
        from seq2onnx.serve.app import create_app

        app = create_app(self.engine, **self.limits)
        self.frontend = app.state.frontend  # (not self.app: Ray's wrapper class owns that name)
        # add_middleware keeps the FastAPI object (Ray adds its back-pressure handlers to it and reads
        # its docs path); wrapping it in another ASGI callable would hide both. Added last, so outermost:
        # the app's own 503s and 413s name the replica too.
        app.add_middleware(ReplicaHeader, name=self.replica_name)
        return app

    def __del__(self):
        # Ray calls this when it stops the replica (scale-down, redeploy, serve.delete), after it has
        # waited for the replica's ongoing requests (graceful_shutdown_timeout_s). What serve/server.py
        # does at SIGTERM: refuse new requests (503, retryable), then close the engine once every
        # submitted job is answered. A replica killed outright never gets here (docs/serving-ray.md).
        frontend = getattr(self, "frontend", None)
        if frontend is not None:
            frontend.drain()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


def _replica_name() -> str:
    """The tag of this replica's id (also the end of its actor's name), or "local" outside Ray Serve."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_tag
    except Exception:  # not inside a Serve replica (a unit test of Replica): any fixed name will do
        return "local"


def build(
    bundle: str | Path,
    num_replicas: int = 2,
    batching: str = "continuous",
    *,
    device: str = "cpu",
    threads: int = 1,
    workers: int = 2,
    health_check_period_s: float = 2.0,
    **limits,
):
    """Returns the bound Ray Serve application: `num_replicas` replicas of the seq2onnx app.

    Args:
        bundle: the bundle directory; every node must hold it at the same absolute path.
        num_replicas: replicas started (each loads the bundle and runs its own engine).
        batching: "continuous" (each replica's own ContinuousEngine) or "request" (RequestEngine).
        device: the Translator's device in each replica ("cpu", "cuda" or "auto").
        threads: onnxruntime intra-op threads per replica; each replica reserves that many CPUs.
        workers: requests decoded at once per replica with batching="request".
        health_check_period_s: how often Ray checks each replica, so how soon a hung one is replaced
            (Ray's default is 10 s; a replica whose process died is replaced at once, whatever this is).
        **limits: create_app's keyword limits (max_queue, max_texts, max_chars, max_body_bytes,
            timeout_s), the same in every replica.

    Returns:
        A ray.serve Application, for serve.run(app, name=APP_NAME, route_prefix="/").

    Raises:
        ValueError: a bundle that is not a directory with a bundle.json, or a wrong option or limit value.
        TypeError: a limit that create_app does not take.
        RuntimeError: a Ray older than MIN_RAY.
    """
    from ray import serve

    _check_ray()
    path = _bundle_path(bundle)
    if batching not in BATCHINGS:
        raise ValueError(f"batching={batching!r}; choose one of {', '.join(BATCHINGS)}")
    _check_counts(num_replicas=num_replicas, threads=threads, workers=workers)
    max_queue = _check_limits(limits)

    deployment = serve.deployment(
        serve.ingress()(Replica),
        name=DEPLOYMENT_NAME,
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": threads, **({"num_gpus": 1} if device == "cuda" else {})},
        # The app admits max_queue requests (then answers 503); letting Ray send it as many makes the
        # replica's own batcher see all of them at once, which is what continuous batching needs.
        # Past that, Ray's router holds requests and answers 503 itself once max_queue more wait.
        max_ongoing_requests=max_queue,
        max_queued_requests=max_queue,
        health_check_period_s=health_check_period_s,
        # A replica being stopped (scale-down, redeploy) first finishes what it holds: the app's own
        # per-request time limit is the longest that can take.
        graceful_shutdown_timeout_s=float(limits.get("timeout_s", 60.0)) + 5.0,
    )
    return deployment.bind(str(path), batching, device, threads, workers, limits)


def _bundle_path(bundle: str | Path) -> Path:
    """The bundle's absolute path (the replicas may run on other nodes), refused without a bundle.json."""
    path = Path(bundle).expanduser().resolve()
    if not (path / "bundle.json").is_file():
        raise ValueError(
            f"{bundle}: no bundle.json there; give a bundle directory (`seq2onnx export` writes one)"
        )
    return path


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; give a whole number of at least 1")


def _check_ray() -> None:
    """Refuses a Ray older than MIN_RAY."""
    import ray

    if tuple(int(part) for part in ray.__version__.split(".")[:2]) < MIN_RAY:
        raise RuntimeError(
            f"Ray {ray.__version__} is installed; this deployment needs Ray "
            f"{'.'.join(map(str, MIN_RAY))} or newer: pip install 'ray[serve]>={'.'.join(map(str, MIN_RAY))}'"
        )


def _check_limits(limits: dict) -> int:
    """Refuses a wrong limit here: it would fail in every replica, over and over as Ray retries them;
    create_app's own checks are run on an engine that decodes nothing. Returns max_queue."""
    from seq2onnx.serve.app import create_app
    from seq2onnx.serve.engine import Engine

    allowed = [p for p, v in inspect.signature(create_app).parameters.items() if v.kind is v.KEYWORD_ONLY]
    unknown = sorted(set(limits) - set(allowed))
    if unknown:
        raise TypeError(f"unknown limit(s) {', '.join(unknown)}; create_app takes {', '.join(allowed)}")
    create_app(Engine(None), **limits)
    return limits.get("max_queue", inspect.signature(create_app).parameters["max_queue"].default)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m seq2onnx.serve.ray_deploy",
        description="Serve a bundle over HTTP from Ray Serve replicas (docs/serving-ray.md).",
    )
    p.add_argument("bundle", help="bundle directory (the same path on every node of a cluster)")
    p.add_argument("--replicas", type=int, default=2, help="replicas, each with its own engine (default 2)")
    p.add_argument("--batching", choices=BATCHINGS, default="continuous", help="each replica's engine")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads (and Ray CPUs) per replica")
    p.add_argument(
        "--workers", type=int, default=2, help="requests decoded at once per replica (--batching request)"
    )
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    p.add_argument("--host", default="127.0.0.1", help="address the proxies listen on (0.0.0.0 on a cluster)")
    p.add_argument(
        "--port", type=int, default=8000, help="HTTP port of the proxy on every node (default 8000)"
    )
    p.add_argument(
        "--address",
        default=None,
        help="a running cluster (auto, HOST:6379); default a fresh local Ray on this machine (no dashboard)",
    )
    p.add_argument("--max-queue", type=int, default=256, help="requests admitted per replica (then 503)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take (then 504)")
    p.add_argument(
        "--detach",
        action="store_true",
        help="return once deployed, leaving the app on the cluster (stop it: `serve shutdown`)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the deployment until SIGINT or SIGTERM (or, with --detach, until it is deployed).

    Returns:
        The exit status: 0, or 2 for a wrong argument (printed as one line).
    """
    args = _parser().parse_args(argv)
    import ray
    from ray import serve

    if args.detach and not args.address:  # a local Ray ends with this process: nothing would be left
        print(
            "error: --detach leaves the app on a cluster; give --address too (a local Ray stops when this "
            "command ends)",
            file=sys.stderr,
        )
        return 2
    try:
        app = build(
            args.bundle,
            args.replicas,
            args.batching,
            device=args.device,
            threads=args.threads,
            workers=args.workers,
            max_queue=args.max_queue,
            timeout_s=args.timeout,
        )
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # "local" starts a fresh instance even where RAY_ADDRESS or an earlier `ray start` names a cluster, and
    # without Ray's dashboard, which Serve does not need: its forkserver is killed with it at the end and
    # leaves a pymp-* folder in TMPDIR per run (a cluster you start yourself keeps its dashboard).
    local = {"include_dashboard": False} if not args.address else {}
    ray.init(address=args.address or "local", logging_level=logging.WARNING, **local)
    # After ray.init (which sets its own SIGTERM handler), before the app can answer: a signal from
    # then on stops the app cleanly, even one that comes while serve.run still waits for replicas.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # EveryNode: each node's proxy listens on the port, so a load balancer can spread over the nodes
    # and a node's loss does not take the only entry point with it.
    serve.start(http_options={"host": args.host, "port": args.port, "location": "EveryNode"})
    serve.run(app, name=APP_NAME, route_prefix="/")
    print(
        f"seq2onnx: {args.replicas} replica(s) ({args.batching} batching) on http://{args.host}:{args.port}/",
        file=sys.stderr,
        flush=True,
    )
    if args.detach:
        return 0
    while not stop.wait(1.0):  # a timed wait, so that the signal handler runs promptly
        pass
    # The replicas drain (graceful_shutdown_timeout_s) before the app is gone; a local Ray then stops.
    serve.delete(APP_NAME)
    if not args.address:
        serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    # Run through the package's module, not __main__: Ray then pickles Replica by reference.
    from seq2onnx.serve.ray_deploy import main as _main

    raise SystemExit(_main())
