"""The kvplan error types.

Three failure channels (STYLE.md): "does not fit" is data in a result; a user mistake raises a
:class:`KvplanError` (one line, plus an optional hint); a broken invariant is an ``assert``.
Library code raises; only the CLI turns these into messages and exit codes.

May import: nothing in kvplan
"""

from __future__ import annotations


class KvplanError(Exception):
    """A user-facing error: a one-line message and an optional one-line hint.

    ``exit_code`` is what the CLI exits with (2: bad input).
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def one_line(self) -> str:
        """The message and hint joined on one line (what the CLI prints)."""
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def lines(self) -> list[str]:
        """Every line the CLI prints for this error: one, or one per mistake when a file has several."""
        return [self.one_line()]


class InputError(KvplanError):
    """A malformed, out-of-range or contradictory option or value."""


class ConfigError(KvplanError):
    """A model config that kvplan cannot interpret (names the file, field and value)."""


class ModelNotFoundError(KvplanError):
    """No local path, bundled spec or Hub repository matches the model name."""


class GpuNotFoundError(KvplanError):
    """The GPU name is not in the catalogue (the hint lists the closest names)."""


class HubError(KvplanError):
    """The Hugging Face Hub could not give us what we asked for (gated, offline, network, ...)."""


class ScenarioError(KvplanError):
    """A YAML scenario file (capacity / what-if / workload) is invalid: file:line:col in the message."""


class TorchMissingError(KvplanError):
    """An optional extra (torch, matplotlib) is needed but not installed."""
