"""Read an admin page's form the way a browser submits it, so tests post exactly what a person could."""

from __future__ import annotations

from html.parser import HTMLParser

SKIPPED_INPUTS = {"submit", "button", "file", "image", "reset"}


class _FormReader(HTMLParser):
    def __init__(self, form_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id = form_id
        self.inside = False
        self.found = False
        self.data: dict[str, list[str]] = {}
        self._select: str | None = None
        self._multiple = False
        self._options: list[list] = []  # [value or None, selected, text]
        self._textarea: str | None = None
        self._text: list[str] = []

    def _add(self, name: str, value: str) -> None:
        self.data.setdefault(name, []).append(value)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("id") == self.form_id:
            self.inside = self.found = True
            return
        if not self.inside or "disabled" in a:
            return
        name = a.get("name")
        if tag == "input" and name:
            kind = (a.get("type") or "text").lower()
            if kind in SKIPPED_INPUTS or (kind in ("checkbox", "radio") and "checked" not in a):
                return
            self._add(name, a.get("value") or ("on" if kind in ("checkbox", "radio") else ""))
        elif tag == "select" and name:
            self._select, self._multiple, self._options = name, "multiple" in a, []
        elif tag == "option" and self._select is not None:
            self._options.append([a.get("value"), "selected" in a, ""])
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.inside:
            self.inside = False
        elif tag == "select" and self._select is not None:
            chosen = [option for option in self._options if option[1]]
            if not chosen and not self._multiple and self._options:
                chosen = self._options[:1]
            for value, _, text in chosen:
                self._add(self._select, value if value is not None else text.strip())
            self._select = None
        elif tag == "textarea" and self._textarea is not None:
            text = "".join(self._text)
            self._add(self._textarea, text[1:] if text.startswith("\n") else text)
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)
        elif self._select is not None and self._options:
            self._options[-1][2] += data


def form_data(html: str, form_id: str) -> dict[str, list[str]]:
    """What submitting the form `form_id` of `html` unchanged would post. Raises if the page has no such form
    (a read-only admin page renders none)."""
    reader = _FormReader(form_id)
    reader.feed(html)
    if not reader.found:
        raise LookupError(f"no form with id {form_id!r} on the page")
    return reader.data


def select_options(html: str, form_id: str, name: str) -> list[str]:
    """The option values of the select `name` in the form `form_id`, empty choice left out."""
    reader = _OptionReader(form_id, name)
    reader.feed(html)
    return [value for value in reader.values if value]


class _OptionReader(HTMLParser):
    def __init__(self, form_id: str, name: str) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id, self.name = form_id, name
        self.inside = self.in_select = False
        self.values: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("id") == self.form_id:
            self.inside = True
        elif self.inside and tag == "select" and a.get("name") == self.name:
            self.in_select = True
        elif self.in_select and tag == "option":
            self.values.append(a.get("value") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.in_select = False
        elif tag == "form":
            self.inside = False
