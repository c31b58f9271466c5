"""Redis holds data only: arq jobs and results are msgpack on both sides, a pickle written into
Redis is refused and runs nothing; Redis ACL users (password in the URL) and TLS (rediss://) work
for the broker's clients and for arq (real redis-servers)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import pickle
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
import redis.exceptions
from arq.jobs import Job as ArqJob
from arq.worker import Worker, get_kwargs

from broker.connection import connect, reply
from broker.keys import Keys
from broker.tasks import (
    JOB_FUNCTION,
    JobFormatError,
    arq_pool,
    enqueue_jobs,
    jobs_for,
    load_job,
    worker_settings,
)
from common.services import free_port, wait_port
from swarl.config import load_config

ROW = {"instance_id": "demo__calc-1", "problem_statement": "x breaks", "repo": "demo/calc"}


class _Payload:
    """Unpickling this runs a shell command: what an attacker with write access to Redis sends."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _settings(url: str, rollout: Any) -> dict[str, Any]:
    cfg = load_config(None, [f"redis.url={url}", "run.id=test", "queue.poll_delay_s=0.1"], environ={})
    s = get_kwargs(worker_settings(cfg.queue, cfg.keys, url, rollout, max_jobs=2))
    s["handle_signals"] = False
    s["burst"] = True
    return s


async def _run_jobs(url: str) -> list[str]:
    """Run a burst worker over the queue; returns the job ids its rollout saw."""
    seen: list[str] = []

    async def rollout(_ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
        seen.append(payload["job_id"])
        return {"ok": True}

    worker = Worker(**_settings(url, rollout))
    try:
        await asyncio.wait_for(worker.async_run(), 60)
    finally:
        await worker.close()
    return seen


def test_load_job_refuses_pickles_and_junk(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(JobFormatError, match="pickle, refused"):
        load_job(pickle.dumps({"f": JOB_FUNCTION, "a": (_Payload(marker),)}))
    assert not marker.exists()
    with pytest.raises(JobFormatError, match="not msgpack"):
        load_job(b"\xc1 not msgpack")
    with pytest.raises(JobFormatError, match="msgpack map"):
        load_job(msgpack.packb([1, 2]))


async def test_jobs_are_msgpack_and_a_pickle_runs_nothing(redis_url: str, keys: Keys, tmp_path: Path) -> None:
    pool = await arq_pool(redis_url)
    try:
        good = jobs_for(keys, ROW, "t", 1)[0]
        assert await enqueue_jobs(pool, keys, [good]) == (1, 0)
        raw = await pool.get(f"arq:job:{good.job_id}")
        assert raw[:1] != b"\x80"
        doc = msgpack.unpackb(raw)
        assert doc["f"] == JOB_FUNCTION and doc["a"][0]["job_id"] == good.job_id

        # An attacker writes a pickled job straight into Redis, the way arq's default would.
        marker = tmp_path / "pwned"
        evil_id = "test:evil"
        evil = pickle.dumps({"t": 1, "f": JOB_FUNCTION, "a": (_Payload(marker),), "k": {}, "et": 0})
        await pool.psetex(f"arq:job:{evil_id}", 60_000, evil)
        await pool.zadd(keys.queue, {evil_id: int(time.time() * 1000)})  # due now (0 means "done" to arq)

        seen = await _run_jobs(redis_url)
        assert seen == [good.job_id]          # the msgpack job ran, the pickle did not
        assert not marker.exists()            # and nothing in it executed
        info = await ArqJob(evil_id, pool, _queue_name=keys.queue, _deserializer=load_job).result_info()
        assert info is not None and info.success is False
        assert "unable to deserialize job" in str(info.result)
        ok = await ArqJob(good.job_id, pool, _queue_name=keys.queue, _deserializer=load_job).result_info()
        assert ok is not None and ok.success and ok.result == {"ok": True}
        assert await reply(pool.sismember(keys.jobs_done, good.job_id))
    finally:
        await pool.aclose()


def _redis_server(tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    exe = shutil.which("redis-server")
    assert exe, "redis-server is missing"
    return subprocess.Popen([exe, "--bind", "127.0.0.1", "--dir", str(tmp), "--save", "", "--appendonly", "no",
                             "--logfile", str(tmp / "redis.log"), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


async def test_acl_user_from_the_url(tmp_path: Path, keys: Keys) -> None:
    port = free_port()
    proc = _redis_server(tmp_path, "--port", str(port))
    try:
        wait_port("127.0.0.1", port)
        admin = redis.Redis(port=port)
        admin.execute_command("ACL", "SETUSER", "actor", "on", ">s3cret", "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")  # no anonymous access any more
        admin.close()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port).ping()
        good = f"redis://actor:s3cret@127.0.0.1:{port}/0"
        bad = f"redis://actor:wrong@127.0.0.1:{port}/0"
        r = connect(good)
        assert await r.ping()
        await r.aclose()
        r = connect(bad)
        with pytest.raises(redis.exceptions.AuthenticationError):
            await r.ping()
        await r.aclose()
        pool = await arq_pool(good)
        try:
            assert await enqueue_jobs(pool, keys, jobs_for(keys, ROW, "t", 2)) == (2, 0)
        finally:
            await pool.aclose()
        assert sorted(await _run_jobs(good)) == [j.job_id for j in jobs_for(keys, ROW, "t", 2)]
    finally:
        _stop(proc)


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    crt, pem = tmp / "redis.crt", tmp / "redis.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


async def test_tls_from_the_url(tmp_path: Path, keys: Keys) -> None:
    crt, pem = _self_signed(tmp_path)
    port = free_port()
    proc = _redis_server(tmp_path, "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(crt),
                         "--tls-key-file", str(pem), "--tls-ca-cert-file", str(crt), "--tls-auth-clients", "no",
                         "--requirepass", "pw")
    try:
        try:
            wait_port("127.0.0.1", port)
        except TimeoutError:
            pytest.skip(f"this redis-server has no TLS: {(tmp_path / 'redis.log').read_text()[-300:]}")
        url = f"rediss://:pw@127.0.0.1:{port}/0?ssl_ca_certs={crt}&ssl_cert_reqs=required"
        r = connect(url)
        assert await r.ping()
        await r.aclose()
        # an unknown CA is refused: the server's certificate is checked
        r = connect(f"rediss://:pw@127.0.0.1:{port}/0?ssl_cert_reqs=required")
        with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await r.ping()
        await r.aclose()
        pool = await arq_pool(url)
        try:
            assert await enqueue_jobs(pool, keys, jobs_for(keys, ROW, "t", 1)) == (1, 0)
        finally:
            await pool.aclose()
        assert await _run_jobs(url) == [jobs_for(keys, ROW, "t", 1)[0].job_id]
    finally:
        _stop(proc)
