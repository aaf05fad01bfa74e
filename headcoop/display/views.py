"""circuitsvis attention views that work offline: a rendering leaf (circuitsvis and the standard library).

circuitsvis puts a CDN import in `str(view)` and probes google.com to decide which to use; here the
JavaScript bundle shipped inside the circuitsvis package is inlined instead. `attention_heads_html` takes
plain data (a heading and AttentionHeads props per view) and never touches a model.
"""

from __future__ import annotations

import html
import json
import uuid
from collections.abc import Sequence
from pathlib import Path

import circuitsvis
from circuitsvis.utils.convert_props import convert_props
from circuitsvis.utils.render import RenderedHTML

BUNDLE_PATH = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"


def circuitsvis_bundle() -> str:
    """The circuitsvis JavaScript bundle, safe to place inside one <script> element."""
    return BUNDLE_PATH.read_text(encoding="utf-8").replace("</script>", "")


_SENT = {"bundle": False}  # whether this kernel has shown a view carrying the circuitsvis bundle


def _in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (`plot.in_kernel`'s test; this leaf imports circuitsvis only)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class AttentionView(RenderedHTML):
    """Self-contained HTML (circuitsvis bundle inlined): `str()` gives it, `save(path)` writes a standalone page,
    `show()` opens it in a browser. In a Jupyter kernel the bundle (1.3 MB) goes out with the first view shown
    and later views carry only their render calls (`_repr_html_`): a notebook holds it once, and its exported
    page runs the scripts in order. Never touches the network."""

    def __init__(self, source: str, markup: str | None = None, calls: str | None = None):
        super().__init__(local_src=source, cdn_src=source)
        self._markup, self._calls = markup, calls

    def _repr_html_(self) -> str:
        if self._calls is None or self._markup is None or not _in_kernel():
            return self.local_src
        if not _SENT["bundle"]:
            _SENT["bundle"] = True
            return self.local_src
        missing = ("<p>the circuitsvis bundle went out with this kernel's first attention view, which this page "
                   "no longer holds: <code>str(view)</code> or <code>view.show()</code> draws it alone</p>")  # fmt: skip
        script = (f"const CircuitsVis = window.CircuitsVis;\nif (CircuitsVis) {{\n{self._calls}\n}} else {{\n"
                  f"for (const div of document.querySelectorAll('[id^=circuits-vis-]')) "
                  f"if (!div.childElementCount) div.innerHTML = {json.dumps(missing)};\n}}")  # fmt: skip
        return self._markup + "\n" + module_script(script)

    def __html__(self) -> str:
        return self.local_src

    def __str__(self) -> str:
        return self.local_src

    def show(self) -> None:
        """Display the view: inline in a Jupyter notebook, else in the default web browser (a temporary page)."""
        try:
            from IPython import get_ipython
            from IPython.display import HTML, display

            if get_ipython() is not None and getattr(get_ipython(), "kernel", None) is not None:
                display(HTML(self.local_src))
                return
        except ImportError:
            pass
        import tempfile
        import webbrowser

        page = Path(tempfile.mkdtemp(prefix="headcoop-view-")) / "attention.html"
        webbrowser.open(self.save(page).as_uri())

    def save(self, path: str | Path) -> Path:
        """Write a standalone HTML page; returns the path."""
        path = Path(path)
        head = "<!DOCTYPE html>\n<html><head><meta charset='utf-8'></head><body>\n"
        path.write_text(f"{head}{self.local_src}\n</body></html>\n", encoding="utf-8")
        return path


def attention_heads_html(views: Sequence[tuple[str, dict]], bundle: bool = True) -> tuple[str, str]:
    """(markup, script) for one heading and div per (heading, AttentionHeads props) and one render call each.

    `script` is JavaScript for one `<script type="module">` element: the bundle first when `bundle`, so a
    page holding many views (the report) can inline the bundle once and append every view's calls.
    """
    divs, calls = [], []
    for heading, props in views:
        div_id = "circuits-vis-" + uuid.uuid4().hex[:13]
        divs.append(f"<h4 style='margin: 10px 0 0 0;'>{html.escape(heading)}</h4>")
        divs.append(f"<div id='{div_id}' style='margin: 15px 0;'></div>")
        js_props = convert_props(props).replace("</", "<\\/")
        calls.append(f"CircuitsVis.render({json.dumps(div_id)}, CircuitsVis.AttentionHeads, {js_props});")
    script = "\n".join([circuitsvis_bundle(), "window.CircuitsVis = CircuitsVis;", *calls] if bundle else calls)
    return "\n".join(divs), script


def module_script(script: str) -> str:
    """`script` wrapped in the <script type="module"> element circuitsvis renders from."""
    return f'<script crossorigin type="module">\n{script}\n</script>'


def attention_view(views: Sequence[tuple[str, dict]]) -> AttentionView:
    """A self-contained AttentionView of the given (heading, props) views."""
    markup, script = attention_heads_html(views)
    calls = script.split("window.CircuitsVis = CircuitsVis;\n", 1)[1]
    return AttentionView(markup + "\n" + module_script(script), markup=markup, calls=calls)
