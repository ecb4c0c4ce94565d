"""Diagnostics: source spans, located messages and the one exception type of circuitc.

Every stage reports problems as `Diagnostic`s; a stage that finds any raises one `CircuitError`
carrying all of them, so a user sees every mistake of a file at once.
"""

from __future__ import annotations

from dataclasses import dataclass

# Output stays readable (and small) however broken the input: a one-line file with thousands of
# problems, or a generated line of megabytes, prints a bounded report.
MAX_SHOWN = 20  # diagnostics rendered; the rest are counted
SOURCE_WINDOW = 100  # characters of the source line echoed around the caret
MAX_MESSAGE = 1000  # characters of one message


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
        message = _clip(self.message)
        if self.span is None:
            return f"{self.severity}: {message}"
        text = f"{self.span}: {self.severity}: {message}"
        if self.span.source_line is not None:
            width = 1
            if self.span.end_line == self.span.line and self.span.end_column:
                width = max(1, self.span.end_column - self.span.column)
            line, column, width = _window(self.span.source_line.rstrip("\n"), self.span.column, width)
            caret = " " * (column - 1) + "^" + "~" * (width - 1)
            text += f"\n    {line}\n    {caret}"
        return text


def _clip(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    return f"{message[:MAX_MESSAGE]}... ({len(message) - MAX_MESSAGE:,} more characters)"


def _window(line: str, column: int, width: int) -> tuple[str, int, int]:
    """At most SOURCE_WINDOW characters of `line` around `column` (1-based), marked with `...` where
    cut, and the caret's column and width within them."""
    line = line.replace("\t", " ")  # one column per character, so the caret lines up
    if len(line) <= SOURCE_WINDOW:
        return line, column, width
    start = max(0, min(column - 1 - SOURCE_WINDOW // 3, len(line) - SOURCE_WINDOW))
    end = start + SOURCE_WINDOW
    prefix = "..." if start > 0 else ""
    text = prefix + line[start:end] + ("..." if end < len(line) else "")
    width = max(1, min(width, end - (column - 1)))
    return text, column - start + len(prefix), width


class CircuitError(ValueError):
    """Raised by the Python API for any bad circuit input; `.diagnostics` lists every problem."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic | str):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(diagnostics)]
        elif isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__(self.render())

    def render(self, max_shown: int = MAX_SHOWN) -> str:
        """Every diagnostic up to `max_shown` errors (each with its notes), then a count of the rest."""
        shown: list[str] = []
        errors = 0
        for k, d in enumerate(self.diagnostics):
            if d.severity != "note":
                errors += 1
                if errors > max_shown:
                    rest = sum(1 for e in self.diagnostics[k:] if e.severity != "note")
                    shown.append(f"... and {rest:,} more error{'s' if rest != 1 else ''}")
                    break
            shown.append(d.render())
        return "\n".join(shown)
