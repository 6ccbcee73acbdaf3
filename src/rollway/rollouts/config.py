"""How rollouts run, as frozen config objects: sampling, per-rollout limits, the retry policy
(together a batch's ``RolloutConfig``), and how the client serves its gateway. Keyword sugar
(``timeout=...``, ``temperature=...``) fills them, at a client's construction and per call."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar
from urllib.parse import urlsplit

from rollway.checks import MAX_SEQ_LEN, check_count, check_seconds
from rollway.errors import ConfigError, InvalidFieldsError
from rollway.generation import SamplingParams
from rollway.retry import Backoff, RetryPolicy, is_transient
from rollway.sampling_settings import SAMPLING_NAMES, SETTING, checked

#: A rollout run again from the start (a new attempt) while its outcome says nothing about
#: the policy (an infrastructure or engine error).
ROLLOUT_ATTEMPTS = RetryPolicy(attempts=3, backoff=Backoff(first_s=0.5), retry_result=is_transient)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: A rollout's default time limit: no configuration hangs forever unless asked to.
DEFAULT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class RolloutLimits:
    """How far one rollout may go. Past ``max_turns`` model calls or ``max_seq_len`` tokens the
    gateway ends it as truncated; past ``timeout`` seconds (None: never) its generation is
    aborted and it is recorded as ``timeout``, the agent getting ``stop_grace_s`` to stop before
    it is cancelled; the reward function has ``reward_timeout`` seconds a try, and a try that
    raised or timed out goes again up to ``reward_retries`` times (``rewards.REWARD_TRIES``)."""

    max_turns: int | None = None
    max_seq_len: int | None = None
    timeout: float | None = DEFAULT_TIMEOUT_S
    reward_timeout: float = 30.0
    stop_grace_s: float = 2.0
    reward_retries: int = 2

    def __post_init__(self) -> None:
        check_count("max_turns", self.max_turns, least=1, optional=True)
        check_count("max_seq_len", self.max_seq_len, least=2, most=MAX_SEQ_LEN, optional=True)
        if self.timeout is not None:
            check_seconds("timeout", self.timeout)
        check_seconds("reward_timeout", self.reward_timeout)
        check_seconds("stop_grace_s", self.stop_grace_s, zero=True)
        check_count("reward_retries", self.reward_retries, least=0, most=20)


@dataclass(frozen=True)
class ServingConfig:
    """How agents outside this process reach the client: its gateway over HTTP (program
    agents, agent servers) and the callback route for agent servers' reports, bound on
    ``host``:``port`` (0: any free port) and advertised as ``public_url`` when they reach it by
    another name. ``http``: serve the gateway (None: when the agent needs it). ``callback``
    False: an agent server's report is found by polling the store instead."""

    http: bool | None = None
    host: str = "127.0.0.1"
    port: int = 0
    public_url: str | None = None
    callback: bool = True

    def __post_init__(self) -> None:
        if self.http is not None and not isinstance(self.http, bool):
            raise ConfigError("http must be True, False or None", "http")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError("host must be a non-empty string", "host")
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError("port must be a whole number from 0 to 65535 (0: any)", "port")
        if self.public_url is not None and not _is_http_url(self.public_url):
            raise ConfigError("public_url must be None or an http(s)://host URL", "public_url")
        if not isinstance(self.callback, bool):
            raise ConfigError("callback must be True or False", "callback")


class RolloutOptions(TypedDict, total=False):
    """The keyword sugar a client takes at construction and per call (``invoke``,
    ``run_batch``): sampling fields, limits, and the retry policy's attempts."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: str | Sequence[str]
    stop_token_ids: Sequence[int]
    seed: int
    top_logprobs: int
    record_entropy: bool
    max_turns: int | None
    max_seq_len: int | None
    timeout: float | None
    reward_timeout: float
    stop_grace_s: float
    reward_retries: int
    max_retry_attempts: int


LIMIT_NAMES = tuple(f.name for f in dataclasses.fields(RolloutLimits))
#: Sugar name -> the RetryPolicy field it sets.
RETRY_NAMES = {"max_retry_attempts": "attempts"}


@dataclass(frozen=True)
class RolloutConfig:
    """How a batch's rollouts run, from the client to wherever they run (pickled to Ray
    workers). Registration fixes the ``sampling`` fields named in ``sampling_fixed``; an agent's
    chat request fills the others (an agent cannot change the policy's sampling behind the
    trainer's back, and keeps what the client left open, such as its own stop strings)."""

    exp_id: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    sampling_fixed: frozenset[str] = frozenset()
    limits: RolloutLimits = field(default_factory=RolloutLimits)
    #: How a rollout is run again after an attempt whose outcome says nothing about the policy
    #: (``ROLLOUT_ATTEMPTS``: 3 attempts in all, 0.5 s x 2^n between them).
    retry: RetryPolicy = ROLLOUT_ATTEMPTS
    debug: bool = False

    @classmethod
    def build(
        cls,
        exp_id: str,
        *,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        limits: RolloutLimits | Mapping[str, Any] | None = None,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        debug: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> RolloutConfig:
        """Settings from config objects (or mappings of their fields) plus keyword sugar; a
        setting given both ways (in a config object and as a keyword) is an error naming it."""
        options = options or {}
        for group, given, names in (
            ("sampling", sampling, SAMPLING_NAMES),
            ("limits", limits, LIMIT_NAMES),
            ("retry", retry, tuple(RETRY_NAMES)),
        ):
            twice = [name for name in names if name in options]
            if given is not None and twice:
                raise ConfigError(
                    f"{twice[0]} is given twice, as a keyword and in {group}=: give it once",
                    twice[0],
                )
        fixed = sampling_fields(sampling) if sampling is not None else {}
        settings = cls(
            exp_id,
            sampling=SamplingParams(**fixed),
            sampling_fixed=frozenset(fixed),
            limits=config_object(RolloutLimits, limits, "limits") or RolloutLimits(),
            retry=_rollout_policy(retry_policy(retry) or ROLLOUT_ATTEMPTS),
            debug=debug,
        )
        return settings.with_options(options)

    def with_options(self, options: Mapping[str, Any]) -> RolloutConfig:
        """These settings with per-call keyword options applied (sampling fields, limits,
        ``max_retry_attempts``); anything else is refused, naming it."""
        if not options:
            return self
        sampling: dict[str, Any] = {}
        limits: dict[str, Any] = {}
        retry: dict[str, Any] = {}
        for name, value in options.items():
            if name in SAMPLING_NAMES:
                sampling[name] = value
            elif name in LIMIT_NAMES:
                limits[name] = value
            elif name in RETRY_NAMES:
                check_count(name, value, least=1)
                retry[RETRY_NAMES[name]] = value
            else:
                raise _unknown_option(name)
        fixed = sampling_fields(sampling) if sampling else {}
        return dataclasses.replace(
            self,
            sampling=self.sampling.replace(**fixed),
            sampling_fixed=self.sampling_fixed.union(fixed),
            limits=dataclasses.replace(self.limits, **limits),
            retry=dataclasses.replace(self.retry, **retry),
        )

    def fixed_sampling(self, sampling: SamplingParams | None = None) -> dict[str, Any]:
        """The fixed sampling fields of ``sampling`` (default: these settings'), as JSON values
        (what a registration and an agent server's init carry)."""
        values = (sampling or self.sampling).to_dict()
        return {name: values[name] for name in SAMPLING_NAMES if name in self.sampling_fixed}

    def to_dict(self) -> dict[str, Any]:
        """What a run's ``config.json`` says about them."""
        return {
            "sampling": self.fixed_sampling(),
            "limits": dataclasses.asdict(self.limits),
            "retry": {
                "attempts": self.retry.attempts,
                "backoff": dataclasses.asdict(self.retry.backoff) if self.retry.backoff else None,
            },
            "debug": self.debug,
        }


def sampling_fields(sampling: SamplingParams | Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields ``sampling`` fixes, as ``SamplingParams`` keyword arguments held as
    it holds them, checked by each setting's declared rule (an error names the field). A
    mapping fixes the fields it names (None: not fixed); a whole ``SamplingParams`` fixes every
    field it gives a value (temperature, top_p and top_k always; the others when set)."""
    if isinstance(sampling, SamplingParams):
        values = {name: getattr(sampling, name) for name in SAMPLING_NAMES}
        return {k: v for k, v in values.items() if k in _ALWAYS or v != SETTING[k].default}
    if not isinstance(sampling, Mapping):
        raise ConfigError(
            f"sampling must be a SamplingParams or a mapping, not {type(sampling).__name__}",
            "sampling",
        )
    for key in sampling:
        if key not in SAMPLING_NAMES:  # an invalid field, as every sampling refusal is
            unknown = _unknown_field("sampling", str(key), SAMPLING_NAMES)
            raise InvalidFieldsError(f"{key}: {unknown.message}", param=str(key))
    return dict(checked({k: v for k, v in sampling.items() if v is not None}))


#: What a whole ``SamplingParams`` always fixes: the fields that shape the distribution.
_ALWAYS = frozenset({"temperature", "top_p", "top_k"})


ConfigT = TypeVar("ConfigT", bound="DataclassInstance")


def config_object(cls: type[ConfigT], given: Any, name: str) -> ConfigT | None:
    """``given`` as a ``cls`` config object: the object itself, None, or a mapping of its
    fields (an unknown field is an error naming it, a bad value one naming its field)."""
    if given is None or isinstance(given, cls):
        return given
    if not isinstance(given, Mapping):
        raise ConfigError(
            f"{name} must be a {cls.__name__} or a mapping of its fields, not "
            f"{type(given).__name__}",
            name,
        )
    known = [f.name for f in dataclasses.fields(cls)]
    for key in given:
        if key not in known:
            raise _unknown_field(name, str(key), known)
    return cls(**given)


def _unknown_field(group: str, key: str, known: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(
        f"unknown {group} field {key!r}: {hint}expected one of {', '.join(known)}", key
    )


def retry_policy(given: RetryPolicy | Mapping[str, Any] | None) -> RetryPolicy | None:
    """``config_object`` for ``retry=``, whose ``backoff`` may be a mapping too."""
    if isinstance(given, Mapping) and isinstance(given.get("backoff"), Mapping):
        given = {**given, "backoff": config_object(Backoff, given["backoff"], "backoff")}
    return config_object(RetryPolicy, given, "retry")


def _is_http_url(url: Any) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:  # a bad port or bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _unknown_option(name: str) -> ConfigError:
    if name == "model":
        return ConfigError(
            "model cannot change per call: rollouts sample from the client's engine (make a "
            "client for another model)",
            name,
        )
    known = [*SAMPLING_NAMES, *LIMIT_NAMES, *RETRY_NAMES]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"unknown option {name!r}: {hint}expected one of {', '.join(known)}", name)


def _rollout_policy(policy: RetryPolicy) -> RetryPolicy:
    """A policy for rollout attempts: one that names nothing retryable retries what
    ``ROLLOUT_ATTEMPTS`` does (outcomes that say nothing about the policy)."""
    if policy.retry_on or policy.retry_result is not None:
        return policy
    return dataclasses.replace(policy, retry_result=is_transient)
