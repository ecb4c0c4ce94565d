"""Diagnostics: source spans, located messages and the one exception type of circuitc.

Every stage reports problems as `Diagnostic`s; a stage that finds any raises one `CircuitError`
carrying all of them, so a user sees every mistake of a file at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceSpan:
    """Where a piece of a `.pc` file starts and ends (1-based lines and columns)."""

    file: str | None
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None
    source_line: str | None = None  # the text of `line`, for the caret display

    def __str__(self) -> str:
        return f"{self.file or '<string>'}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Diagnostic:
    """One problem, optionally located in a source file."""

    message: str
    span: SourceSpan | None = None
    severity: str = "error"

    @property
    def file(self) -> str | None:
        return self.span.file if self.span else None

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def column(self) -> int | None:
        return self.span.column if self.span else None

    def render(self) -> str:
        """The compiler-style text: `file:line:col: error: message`, the source line and a caret."""
        if self.span is None:
            return f"{self.severity}: {self.message}"
        text = f"{self.span}: {self.severity}: {self.message}"
        if self.span.source_line is not None:
            line = self.span.source_line.rstrip("\n")
            width = 1
            if self.span.end_line == self.span.line and self.span.end_column:
                width = max(1, self.span.end_column - self.span.column)
            caret = " " * (self.span.column - 1) + "^" + "~" * (width - 1)
            text += f"\n    {line}\n    {caret}"
        return text


class CircuitError(ValueError):
    """Raised by the Python API for any bad circuit input; `.diagnostics` lists every problem."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic | str):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(diagnostics)]
        elif isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(d.render() for d in self.diagnostics)
