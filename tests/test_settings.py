"""Settings: one field each, read from `GATEWAY_<NAME>` only, a flag each (offline)."""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from gateway.cli import ConfigError, build_settings, given_settings, serve
from gateway.settings import Settings, UnknownSettingsWarning

FIELDS = dict(Settings.model_fields)
# Samples that are valid only beside another setting (a rule over several settings).
COMPANIONS: dict[str, dict[str, str]] = {
    "workers": {"GATEWAY_REDIS_URL": "redis://127.0.0.1:6379/0"},
    "jwt_previous_secrets": {"GATEWAY_JWT_SECRET": "s" * 40},
    "min_replicas_acked": {"GATEWAY_REDIS_URL": "redis://127.0.0.1:6379/0"},
}


@pytest.fixture(autouse=True)
def no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("GATEWAY_") or name.upper() in {n.upper() for n in FIELDS}:
            monkeypatch.delenv(name)


def sample(name: str, field: FieldInfo) -> tuple[list[str], Any]:
    """Text values for one setting (env: joined by commas) and the value they give.

    Always valid and never the default, so reading the setting shows.
    """
    default = field.get_default()
    annotation = field.annotation
    if name == "host":
        return ["localhost"], "localhost"
    if name == "jwt_secret":
        return ["s" * 40], "s" * 40
    if name == "subject_stream_share":
        return ["0.5"], 0.5
    if name == "jwt_previous_secrets":
        return ["p" * 40, "q" * 40], ("p" * 40, "q" * 40)
    if name == "jwt_app_keys":
        return ["a:" + "p" * 40, "b:" + "q" * 40], ("a:" + "p" * 40, "b:" + "q" * 40)
    if name == "redis_url":  # a URL the settings accept (nothing connects here)
        return ["redis://127.0.0.1:6399/0"], "redis://127.0.0.1:6399/0"
    if name == "cors_origins":
        return ["http://a.example", "https://b.example"], ("http://a.example", "https://b.example")
    if annotation is bool:
        return [str(not default).lower()], not default
    if typing.get_origin(annotation) is typing.Literal:
        other = next(a for a in typing.get_args(annotation) if a != default)
        return [other], other
    if typing.get_origin(annotation) is tuple:
        return ["a1", "b2"], ("a1", "b2")
    if annotation in (int, float):
        return [str(default + 1)], default + 1
    if annotation == int | None:
        return ["42"], 42
    return ["sample-value"], "sample-value"


def flag_args(name: str, field: FieldInfo) -> list[str]:
    texts, value = sample(name, field)
    flag = "--" + name.replace("_", "-")
    if field.annotation is bool:
        return [flag if value else "--no-" + flag[2:]]
    return [part for text in texts for part in (flag, text)]


def test_every_setting_has_a_description() -> None:
    assert all(field.description for field in FIELDS.values())


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_reads_its_gateway_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts, value = sample(name, FIELDS[name])
    monkeypatch.setenv(f"GATEWAY_{name.upper()}", ",".join(texts))
    for variable, text in COMPANIONS.get(name, {}).items():
        monkeypatch.setenv(variable, text)
    assert getattr(Settings(), name) == value


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_has_a_flag_that_beats_its_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, value = sample(name, FIELDS[name])
    ctx = serve.make_context("serve", flag_args(name, FIELDS[name]))
    given = given_settings(ctx)
    assert list(given) == [name]  # only what the command line gave
    monkeypatch.setenv(f"GATEWAY_{name.upper()}", "not used")
    for variable, text in COMPANIONS.get(name, {}).items():
        monkeypatch.setenv(variable, text)
    assert getattr(build_settings(given), name) == value


def test_serve_help_lists_every_setting_with_its_variable() -> None:
    help_text = " ".join(serve.get_help(click.Context(serve, info_name="serve")).split())
    for name in FIELDS:
        assert "--" + name.replace("_", "-") in help_text
        assert f"env GATEWAY_{name.upper()}" in help_text.replace("- ", "-")


def test_unprefixed_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another program's API_KEYS or STREAM_TTL_SECONDS in the same environment must not
    # configure the gateway: every field's bare name, set to a value it would accept.
    for name, field in FIELDS.items():
        monkeypatch.setenv(name.upper(), ",".join(sample(name, field)[0]))
    settings = Settings()
    assert settings.model_dump() == {name: field.get_default() for name, field in FIELDS.items()}
    assert settings.api_keys == () and settings.stream_ttl_seconds == 86_400


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("GATEWAY_API_KEY", "GATEWAY_API_KEYS"),
        ("GATEWAY_JWT_SECRETS", "GATEWAY_JWT_SECRET"),
        ("GATEWAY_HEARTBEAT_INTERVAL", "GATEWAY_HEARTBEAT_INTERVAL_SECONDS"),
        ("gateway_max_connection", "GATEWAY_MAX_CONNECTIONS"),
    ],
)
def test_a_likely_typo_of_a_setting_is_refused(
    variable: str, meant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It would leave the setting it was meant for at its default, silently.
    monkeypatch.setenv(variable, "k1")
    with pytest.raises(ConfigError) as caught:
        build_settings({}, notes=[])
    assert f"unknown settings in the environment: {variable.upper()}" in str(caught.value)
    assert f"did you mean {meant}?" in str(caught.value)


# What Kubernetes gives every container of a namespace with a Service named `gateway`.
SERVICE_LINKS = {
    "GATEWAY_SERVICE_HOST": "10.0.0.1",
    "GATEWAY_SERVICE_PORT": "80",
    "GATEWAY_SERVICE_PORT_HTTP": "80",
    "GATEWAY_PORT": "tcp://10.0.0.1:80",
    "GATEWAY_PORT_80_TCP": "tcp://10.0.0.1:80",
    "GATEWAY_PORT_80_TCP_PROTO": "tcp",
    "GATEWAY_PORT_80_TCP_PORT": "80",
    "GATEWAY_PORT_80_TCP_ADDR": "10.0.0.1",
    # and for a Service named `gateway-redis` in the same namespace
    "GATEWAY_REDIS_SERVICE_HOST": "10.0.0.2",
    "GATEWAY_REDIS_SERVICE_PORT": "6379",
    "GATEWAY_REDIS_PORT": "tcp://10.0.0.2:6379",
    "GATEWAY_REDIS_PORT_6379_TCP_ADDR": "10.0.0.2",
}


def test_unknown_variables_are_ignored_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**SERVICE_LINKS, "GATEWAY_PYTHON": "/usr/bin/python3"}.items():
        monkeypatch.setenv(name, value)
    notes: list[str] = []
    settings = build_settings({}, notes)
    assert settings.port == 8000  # the service link's tcp://… is not a port: ignored
    assert len(notes) == 1
    for name in [*SERVICE_LINKS, "GATEWAY_PYTHON"]:
        assert name + "," in notes[0] + ",", name
    # Library users get the same as a Python warning.
    with pytest.warns(UnknownSettingsWarning, match="GATEWAY_SERVICE_HOST"):
        Settings()
    monkeypatch.setenv("GATEWAY_PORT", "9001")  # a real port is still read
    assert build_settings({}, []).port == 9001


def test_a_service_link_port_does_not_hide_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_PORT", "tcp://10.0.0.1:80")
    assert build_settings({"port": 8123}, []).port == 8123


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("https://App.Example.com", "https://app.example.com"),
        ("HTTPS://app.example.com:443", "https://app.example.com"),
        ("http://x.example:80/", "http://x.example"),
        ("https://x.example:80", "https://x.example:80"),
        ("http://localhost:08080", "http://localhost:8080"),
        ("http://[::1]:3000", "http://[::1]:3000"),
        ("http://[FE80::1]", "http://[fe80::1]"),
    ],
)
def test_cors_origins_are_normalised_to_what_browsers_send(given: str, normal: str) -> None:
    assert Settings(cors_origins=(given,)).cors_origins == (normal,)


@pytest.mark.parametrize(
    ("origin", "needle"),
    [
        ("https://app.example.com/path", "is not an origin"),
        ("app.example.com", "is not an origin"),
        ("ftp://app.example.com", "is not an origin"),
        ("https://app.example.com:70000", "out of range"),
        ("https://app.example.com:0", "out of range"),
        ("https://bücher.example", "is not an origin"),
    ],
)
def test_a_cors_origin_that_could_never_match_is_refused(origin: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_settings({"cors_origins": (origin,)})


def test_duplicate_origins_after_normalising_are_kept_once() -> None:
    settings = Settings(cors_origins=("https://A.example", "https://a.example:443"))
    assert settings.cors_origins == ("https://a.example",)


def test_open_mode_with_any_origin_is_refused_unless_forced() -> None:
    with pytest.raises(ConfigError, match="--allow-open-any-origin"):
        build_settings({"cors_origins": ("*",)})
    assert Settings(cors_origins=("*",), allow_open_any_origin=True).cors_origins == ("*",)
    assert Settings(cors_origins=("*",), api_keys=("k1",)).cors_origins == ("*",)
    assert Settings(cors_origins=("*",), jwt_secret="s" * 40).cors_origins == ("*",)
    # A list of origins the operator trusts stays allowed in open mode.
    assert Settings(cors_origins=("http://localhost:3000",)).cors_origins


def test_previous_jwt_secrets_are_checked_and_need_a_current_one() -> None:
    with pytest.raises(ConfigError, match="needs jwt_secret"):
        build_settings({"jwt_previous_secrets": ("p" * 40,)})
    with pytest.raises(ConfigError) as caught:
        build_settings({"jwt_secret": "s" * 40, "jwt_previous_secrets": ("short-old",)})
    assert "at least 32 bytes" in str(caught.value) and "short-old" not in str(caught.value)
    good = Settings(jwt_secret="s" * 40, jwt_previous_secrets=("p" * 40,))
    assert "p" * 40 not in repr(good)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "gateway.example"])
def test_serving_policy_holds_for_library_users(host: str) -> None:
    # create_app(settings) users build Settings themselves: the policy is part of them.
    with pytest.raises(ValidationError, match="--allow-open-nonloopback"):
        Settings(host=host)
    assert Settings(host=host, api_keys=("k1",)).host == host
    assert Settings(host=host, jwt_secret="s" * 40).host == host
    assert Settings(host=host, allow_open_nonloopback=True).host == host
    assert Settings(host="127.0.0.1").host == "127.0.0.1"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"api_keys": ("k1", " ")}, "an API key must not be empty"),
        ({"jwt_secret": "short-secret"}, "at least 32 bytes"),
    ],
)
def test_secrets_are_checked_and_never_echoed(values: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(values)
    assert needle in str(caught.value)
    assert "short-secret" not in str(caught.value) and "k1" not in str(caught.value)
    good = Settings(api_keys=("key-123456",), jwt_secret="s" * 40)
    assert "key-123456" not in repr(good) and "s" * 40 not in repr(good)


@pytest.mark.parametrize(
    ("option", "setting"),
    [
        ("max_connections=4", "redis_max_connections"),
        ("timeout=3", "redis_command_timeout_seconds"),
        ("socket_timeout=1", "redis_command_timeout_seconds"),
        ("socket_connect_timeout=1", "redis_connect_timeout_seconds"),
    ],
)
def test_redis_url_options_that_are_settings_are_refused(option: str, setting: str) -> None:
    # The pool's size, and the timeouts, are set once (the bridge's turns at the pool are
    # as many as its connections); the URL is never echoed (it may hold a password).
    url = f"redis://:hunter2secret@127.0.0.1:6379/0?{option}"
    with pytest.raises(ConfigError) as caught:
        build_settings({"redis_url": url})
    assert setting in str(caught.value) and "hunter2secret" not in str(caught.value)


@pytest.mark.parametrize("option", ["decode_responses=true", "encoding=latin-1"])
def test_redis_url_options_that_decode_replies_are_refused(option: str) -> None:
    # The bridge reads replies as bytes (notifications are parsed as bytes): decoded ones
    # would go unrecognised.
    url = f"redis://:hunter2secret@127.0.0.1:6379/0?{option}"
    with pytest.raises(ConfigError) as caught:
        build_settings({"redis_url": url})
    message = str(caught.value)
    assert option.split("=")[0] in message and "not supported" in message
    assert "hunter2secret" not in message
    other = Settings(redis_url="redis://:hunter2secret@127.0.0.1:6379/0?health_check_interval=5")
    assert "hunter2secret" not in repr(other)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://:hunter2secret@127.0.0.1:port/0", "port is not a number"),
        ("redis://:hunter2secret@127.0.0.1:70000/0", "port is not a number"),
        ("https://:hunter2secret@127.0.0.1:6379/0", "scheme must be one of"),
        ("rediss://:hunter2secret@h:6380/0?ssl_ca_certs=/nonexistent/ca.crt", "ssl_ca_certs file"),
        ("rediss://:hunter2secret@h:6380/0?ssl_certfile=/nonexistent/c.crt", "ssl_certfile file"),
        ("rediss+cluster://:hunter2secret@h:6380/0?ssl_keyfile=/", "ssl_keyfile file"),
        ("rediss://:hunter2secret@h:6380/0?ssl_ca_path=/nonexistent", "ssl_ca_path directory"),
    ],
)
def test_a_redis_url_the_client_cannot_use_is_refused_without_echoing_it(
    url: str, reason: str
) -> None:
    # Otherwise: a traceback at startup, or (a TLS file not mounted) "No such file or
    # directory" at every connection attempt, naming no file.
    with pytest.raises(ConfigError) as caught:
        build_settings({"redis_url": url})
    assert reason in str(caught.value) and "hunter2secret" not in str(caught.value)


def test_a_redis_url_with_tls_files_that_exist_is_accepted(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("(a PEM file)")
    url = f"rediss+cluster://:pw@h:6380/0?ssl_ca_certs={ca}&ssl_ca_path={tmp_path}"
    assert Settings(redis_url=url).redis_url == url


def test_several_workers_need_the_redis_bridge() -> None:
    # Memory-bridge workers would share no runs: refused for library users too.
    with pytest.raises(ValidationError, match="needs the Redis bridge"):
        Settings(workers=2)
    assert Settings(workers=2, redis_url="redis://127.0.0.1:6379/0").workers == 2
    assert Settings(workers=1).workers == 1


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Settings().port = 1  # type: ignore[misc]
