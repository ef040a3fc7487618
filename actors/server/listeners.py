"""A broker's listeners from Kafka's settings: names, security protocols, addresses, and
what each needs (a TLS context, a SASL authenticator); and how the broker itself connects
to the others (the inter-broker listener). Pure functions of the cluster config, apart
from reading the PEM files named in it.

Settings (Kafka's names; ``listener.name.<name>.<setting>`` overrides a setting for one
listener, as in Kafka):

- ``listeners``: ``NAME://host:port,...`` (default ``PLAINTEXT://<node address>:0``);
  ``listener.security.protocol.map``: ``NAME:PROTOCOL,...`` (default: each of PLAINTEXT,
  SSL, SASL_PLAINTEXT, SASL_SSL is its own name's protocol); ``advertised.listeners``:
  the same form, matched by name. A fixed port P puts broker i on P+i (so one config
  serves every broker of a machine: space two listeners' ports by at least the number of
  brokers); port 0 is a free port.
- TLS (SSL, SASL_SSL): ``ssl.certificate.location`` and ``ssl.key.location`` (PEM; the
  chain's first certificate is the broker's), ``ssl.key.password``, ``ssl.ca.location``
  (the CA that signed the other brokers' certificates, and clients' when
  ``ssl.client.auth`` is ``required`` or ``requested``), ``ssl.endpoint.identification.
  algorithm`` (``https``, the default: a broker checks the host name of the broker it
  connects to; empty: it does not).
  Instead of files, the PEM text itself (Kafka's KIP-651, what ``secure=True`` sets, so
  that a broker on any node has them): ``ssl.keystore.type=PEM`` with
  ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key``, ``ssl.truststore.type=PEM``
  with ``ssl.truststore.certificates``. A location, when given, wins.
- SASL: ``sasl.enabled.mechanisms`` (default ``SCRAM-SHA-256,SCRAM-SHA-512,PLAIN``; Kafka's
  default is GSSAPI, which raykafka does not implement), ``connection.failed.
  authentication.delay.ms`` (default 100).
- Inter-broker: ``inter.broker.listener.name`` (default: the first listener),
  ``sasl.mechanism.inter.broker.protocol`` (default SCRAM-SHA-512), ``sasl.jaas.config``
  (``... username="broker" password="...";``, Kafka's JAAS line) for its credential.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from dataclasses import dataclass

from ..connection import ClientSecurity
from ..errors import IllegalArgumentError
from .network import SECURITY_PROTOCOLS, ListenerSecurity

DEFAULT_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
DEFAULT_INTER_BROKER_MECHANISM = "SCRAM-SHA-512"
DEFAULT_FAILED_AUTH_DELAY_MS = 100
_JAAS_FIELD = re.compile(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ListenerSpec:
    """One listener of one broker: bind ``host``/``port`` (0: a free port), advertise
    ``adv_host``/``adv_port`` (None: the bound ones)."""

    name: str
    protocol: str
    host: str
    port: int
    adv_host: str | None = None
    adv_port: int | None = None


def _setting(config: dict, listener: str | None, key: str, default=None):
    if listener is not None:
        scoped = f"listener.name.{listener.lower()}.{key}"
        if scoped in config:
            return config[scoped]
    return config.get(key, default)


def protocol_map(config: dict) -> dict[str, str]:
    text = config.get("listener.security.protocol.map")
    if not text:
        return {p: p for p in SECURITY_PROTOCOLS}
    out = {}
    for item in str(text).split(","):
        name, sep, protocol = item.strip().partition(":")
        if not sep or protocol.upper() not in SECURITY_PROTOCOLS:
            raise IllegalArgumentError(f"listener.security.protocol.map: {item!r} is not "
                                       f"NAME:PROTOCOL with a protocol of "
                                       f"{', '.join(SECURITY_PROTOCOLS)}")
        out[name.upper()] = protocol.upper()
    return out


def _parse(text: str, setting: str) -> list[tuple[str, str, int]]:
    out = []
    for item in str(text).split(","):
        name, sep, address = item.strip().partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not port.isdigit() or not name:
            raise IllegalArgumentError(f"{setting}: expected NAME://host:port, got {item!r}")
        out.append((name.upper(), host.strip("[]"), int(port)))
    return out


def listener_specs(broker_id: int, config: dict, node_host: str | None) -> list[ListenerSpec]:
    """The broker's listeners, in the order of ``listeners`` (see the module docstring). A
    wildcard host (0.0.0.0, ::, empty) binds every address and advertises the node's."""
    protocols = protocol_map(config)
    bound = _parse(config.get("listeners") or f"PLAINTEXT://{node_host or '127.0.0.1'}:0",
                   "listeners")
    advertised = {name: (host, port) for name, host, port in
                  _parse(config["advertised.listeners"], "advertised.listeners")} \
        if config.get("advertised.listeners") else {}
    specs, names = [], set()
    for name, host, port in bound:
        if name not in protocols:
            raise IllegalArgumentError(f"listeners: {name} has no security protocol in "
                                       f"listener.security.protocol.map")
        if name in names:
            raise IllegalArgumentError(f"listeners: {name} is listed twice")
        names.add(name)
        host = host or "0.0.0.0"
        adv_host, adv_port = None, None
        if name in advertised:
            adv_host, p = advertised[name]
            adv_port = p + broker_id if p else None
        elif host in ("0.0.0.0", "::"):
            adv_host = node_host
        specs.append(ListenerSpec(name, protocols[name], host, port + broker_id if port else 0,
                                  adv_host, adv_port))
    return specs


def inter_broker_listener(config: dict, specs: list[ListenerSpec]) -> ListenerSpec:
    name = config.get("inter.broker.listener.name")
    if not name:
        return specs[0]
    for spec in specs:
        if spec.name == str(name).upper():
            return spec
    raise IllegalArgumentError(f"inter.broker.listener.name {name!r} is not one of the "
                               f"listeners ({', '.join(s.name for s in specs)})")


def _server_context(config: dict, name: str) -> ssl.SSLContext:
    cert = _setting(config, name, "ssl.certificate.location")
    key = _setting(config, name, "ssl.key.location")
    chain, pem_key = _pem_setting(config, name, "ssl.keystore", "certificate.chain"), \
        _pem_setting(config, name, "ssl.keystore", "key")
    if not cert and not (chain and pem_key):
        raise IllegalArgumentError(f"listener {name} uses TLS: ssl.certificate.location "
                                   f"(and ssl.key.location) must name PEM files, or "
                                   f"ssl.keystore.certificate.chain and ssl.keystore.key "
                                   f"give them (ssl.keystore.type=PEM)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if cert:
            context.load_cert_chain(cert, key,
                                    password=_setting(config, name, "ssl.key.password"))
        else:
            _load_pem_chain(context, chain, pem_key,
                            _setting(config, name, "ssl.key.password"))
        _load_trust(context, config, name)
    except (OSError, ssl.SSLError) as exc:
        raise IllegalArgumentError(f"listener {name}: cannot load its TLS files: {exc}"
                                   ) from None
    auth = str(_setting(config, name, "ssl.client.auth", "none")).lower()
    modes = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
             "required": ssl.CERT_REQUIRED}
    if auth not in modes:
        raise IllegalArgumentError(f"ssl.client.auth must be none, requested or required, "
                                   f"got {auth!r}")
    context.verify_mode = modes[auth]
    return context


def _pem_setting(config: dict, name: str | None, store: str, key: str) -> str | None:
    """A KIP-651 PEM-text setting (``<store>.<key>``), checking ``<store>.type`` is PEM."""
    value = _setting(config, name, f"{store}.{key}")
    if not value:
        return None
    kind = str(_setting(config, name, f"{store}.type", "PEM")).upper()
    if kind != "PEM":
        raise IllegalArgumentError(f"{store}.{key} needs {store}.type=PEM, got {kind} "
                                   f"(JKS and PKCS12 stores are not implemented)")
    return str(value)


def _load_pem_chain(context: ssl.SSLContext, chain: str, key: str, password) -> None:
    """Load a certificate chain and key given as PEM text: Python's ssl reads them from
    files only, so they go through a private temporary directory (0700), removed at once."""
    with tempfile.TemporaryDirectory(prefix="raykafka-tls-") as tmp:
        path = os.path.join(tmp, "keystore.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.strip() + "\n" + chain.strip() + "\n")
        context.load_cert_chain(path, password=password)


def _load_trust(context: ssl.SSLContext, config: dict, name: str | None) -> None:
    ca = _setting(config, name, "ssl.ca.location")
    if ca:
        context.load_verify_locations(cafile=ca)
        return
    pem = _pem_setting(config, name, "ssl.truststore", "certificates")
    if pem:
        context.load_verify_locations(cadata=pem)


def enabled_mechanisms(config: dict, name: str | None = None) -> tuple[str, ...]:
    text = _setting(config, name, "sasl.enabled.mechanisms")
    mechanisms = tuple(m.strip().upper() for m in str(text).split(",") if m.strip()) \
        if text else DEFAULT_MECHANISMS
    unknown = [m for m in mechanisms if m not in DEFAULT_MECHANISMS]
    if unknown or not mechanisms:
        raise IllegalArgumentError(f"sasl.enabled.mechanisms: {', '.join(unknown) or 'none'}"
                                   f" not implemented; choose from "
                                   f"{', '.join(DEFAULT_MECHANISMS)}")
    return mechanisms


def listener_security(spec: ListenerSpec, config: dict, authenticator=None
                      ) -> ListenerSecurity:
    """``spec``'s ListenerSecurity. ``authenticator(mechanisms)`` makes a connection's SASL
    state (SASL listeners only)."""
    tls = spec.protocol.endswith("SSL")
    sasl = spec.protocol.startswith("SASL")
    mechanisms = enabled_mechanisms(config, spec.name) if sasl else ()
    delay = int(_setting(config, spec.name, "connection.failed.authentication.delay.ms",
                         DEFAULT_FAILED_AUTH_DELAY_MS))
    return ListenerSecurity(
        name=spec.name, protocol=spec.protocol,
        ssl_context=_server_context(config, spec.name) if tls else None,
        authenticator=(lambda: authenticator(mechanisms)) if sasl else None,
        failed_authentication_delay_ms=delay)


def jaas_credentials(config: dict, name: str | None = None, mechanism: str | None = None
                     ) -> tuple[str, str] | None:
    """(user, password) of ``sasl.jaas.config`` (or its listener- and mechanism-scoped
    form, ``listener.name.<l>.<mechanism>.sasl.jaas.config``); None when not set."""
    text = None
    if name and mechanism:
        text = config.get(f"listener.name.{name.lower()}.{mechanism.lower()}."
                          f"sasl.jaas.config")
    text = text or _setting(config, name, "sasl.jaas.config")
    if not text:
        return None
    fields = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_FIELD.findall(str(text))}
    if "username" not in fields or "password" not in fields:
        raise IllegalArgumentError("sasl.jaas.config must give username=\"...\" and "
                                   "password=\"...\"")
    return fields["username"], fields["password"]


def inter_broker_security(config: dict, spec: ListenerSpec) -> ClientSecurity:
    """How this broker's fetchers connect to the others' ``spec`` listener."""
    mechanism = str(config.get("sasl.mechanism.inter.broker.protocol",
                               DEFAULT_INTER_BROKER_MECHANISM)).upper()
    settings = {"security_protocol": spec.protocol, "sasl_mechanism": mechanism}
    if spec.protocol.startswith("SASL"):
        if mechanism not in enabled_mechanisms(config, spec.name):
            raise IllegalArgumentError(f"sasl.mechanism.inter.broker.protocol {mechanism} is "
                                       f"not enabled on listener {spec.name}")
        creds = jaas_credentials(config, spec.name, mechanism)
        if creds is None:
            raise IllegalArgumentError(f"inter-broker listener {spec.name} uses SASL: "
                                       f"sasl.jaas.config must give the brokers' credential")
        settings["sasl_plain_username"], settings["sasl_plain_password"] = creds
    if spec.protocol.endswith("SSL"):
        settings["ssl_cafile"] = _setting(config, spec.name, "ssl.ca.location")
        if not settings["ssl_cafile"]:
            settings["ssl_cadata"] = _pem_setting(config, spec.name, "ssl.truststore",
                                                  "certificates")
        settings["ssl_check_hostname"] = bool(_setting(
            config, spec.name, "ssl.endpoint.identification.algorithm", "https"))
    return ClientSecurity.from_config(settings)


__all__ = ["ListenerSpec", "listener_specs", "listener_security", "inter_broker_listener",
           "inter_broker_security", "jaas_credentials", "protocol_map", "enabled_mechanisms"]
