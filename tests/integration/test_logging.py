"""Library logging follows Python conventions: stdlib ``logging`` underneath, logger "aionet",
no output below WARNING unless the program asks, ``[log] level`` honoured (issue 11, item 17)."""

import logging

import pytest

import aionet
from aionet.errors import ConfigError
from aionet.log import JSONFormatter, get_logger


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def aionet_logger():
    """The "aionet" stdlib logger, restored (level, handlers, propagate) afterwards."""
    lg = logging.getLogger("aionet")
    saved = lg.level, list(lg.handlers), lg.propagate
    keep = _Keep()
    lg.addHandler(keep)
    yield lg, keep
    lg.setLevel(saved[0])
    lg.handlers[:] = saved[1]
    lg.propagate = saved[2]


async def _two_nodes(**kw) -> None:
    async with (
        aionet.Node(name="la", listen="tcp://127.0.0.1:0", **kw) as a,
        aionet.Node(name="lb", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        assert await b.request("la", "aionet.echo", 1, timeout=5) == 1


def test_stdlib_level_and_handler_capture_info_lines(aionet_logger):
    lg, keep = aionet_logger
    lg.setLevel(logging.INFO)
    aionet.run(_two_nodes())
    infos = [r for r in keep.records if r.levelno == logging.INFO]
    assert infos, "no info records reached the stdlib 'aionet' logger"
    assert all(r.name.startswith("aionet.") for r in keep.records)
    assert not [r for r in keep.records if r.levelno < logging.INFO]
    listening = [r for r in infos if r.getMessage().startswith("listening")]
    assert listening and "address=tcp://127.0.0.1:" in listening[0].getMessage()
    # the structured fields travel too, for JSON output
    assert listening[0].aionet_fields["node"] in ("la", "lb")
    assert '"event": "listening"' in JSONFormatter().format(listening[0])


def test_default_level_drops_info(aionet_logger):
    lg, keep = aionet_logger
    lg.setLevel(logging.NOTSET)  # as in a fresh program: the root's WARNING applies
    aionet.run(_two_nodes())
    assert not [r for r in keep.records if r.levelno < logging.WARNING]


def test_config_log_level_debug_is_honoured(aionet_logger, tmp_path):
    lg, keep = aionet_logger
    lg.setLevel(logging.NOTSET)
    cfg = tmp_path / "node.toml"
    cfg.write_text('[node]\nname = "dbg"\nlisten = ["tcp://127.0.0.1:0"]\n[log]\nlevel = "debug"\n')

    async def main() -> None:
        async with aionet.Node.from_config(cfg):
            pass

    aionet.run(main())
    assert lg.level == logging.DEBUG
    assert [r for r in keep.records if r.levelno == logging.DEBUG], "no debug records with [log] level = debug"


def test_log_level_is_validated():
    with pytest.raises(ConfigError, match="log.level must be one of"):
        aionet.config.Config.from_dict({"log": {"level": "loud"}}, env={})


def test_programs_structlog_configuration_does_not_touch_aionet(aionet_logger, capsys):
    """aionet builds its loggers with their own processors: a program's structlog setup
    (here: print everything to stdout) neither receives aionet's events nor changes them."""
    import structlog

    lg, keep = aionet_logger
    lg.setLevel(logging.INFO)
    saved = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(), processors=[structlog.dev.ConsoleRenderer()])
    try:
        get_logger("aionet.test", node="x").info("hello", k=1)
    finally:
        structlog.configure(**saved)
    assert capsys.readouterr().out == ""
    assert [r.getMessage() for r in keep.records] == ["hello  k=1 node=x"]
