"""Sphinx configuration of the course's book (read by ``book/build.py``; see its docstring).

The sources are the staged tree ``_build/src`` (book/pages.py): notebooks
already executed (book/execute.py), so MyST-NB only renders them. MathJax and
the widget manager are served from the site itself (book/assets.py).
"""

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ASSETS = Path(os.environ["COMMTAX_BOOK_ASSETS"])  # set by build.py
REPOSITORY = os.environ.get("COMMTAX_BOOK_REPOSITORY", "")

project = "The Communication Tax"
author = "The Communication Tax contributors"
copyright = "the course's authors (MIT License)"
html_title = "The Communication Tax"

extensions = ["myst_nb", "sphinx_book_theme"]
root_doc = "index"
exclude_patterns = ["_notebooks/**"]  # the stored notebooks: downloads, not pages

# MyST: $...$ and $$...$$ math as in JupyterLab, and the directives the staged pages use.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

# MyST-NB: render the executed notebooks as they are; never run them again here.
nb_execution_mode = "off"
nb_merge_streams = True  # one block per cell for print() output
# The calculators' saved state is drawn by the widget manager served with the site (no CDN).
nb_ipywidgets_js = {"html-manager/embed.js": {}}

mathjax_path = "mathjax/tex-mml-chtml.js"

html_theme = "sphinx_book_theme"
html_static_path = [str(HERE / "static"), str(ASSETS)]
html_css_files = ["commtax-book.css"]
# After MathJax (deferred, priority 500), before the widgets are drawn on "load".
html_js_files = [("commtax-book.js", {"defer": "defer", "priority": 800})]
html_favicon = str(HERE / "static" / "favicon.svg")  # a ring of four ranks; spares a 404 for /favicon.ico
html_context = {"default_mode": "light"}  # the plots are drawn on white
html_last_updated_fmt = None
html_copy_source = True  # the theme's download button offers each page's source
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "use_repository_button": bool(REPOSITORY),
    "use_source_button": bool(REPOSITORY),
    "repository_url": REPOSITORY or None,
    "repository_branch": "main",
    "navigation_with_keys": False,
}
if not REPOSITORY:
    html_theme_options.pop("repository_url")
