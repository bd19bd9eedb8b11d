"""The viewer's page in a real browser (issue 56): headless Chromium from Debian's `chromium` and
`chromium-driver` packages (scripts/browser.sh installs them; nothing is downloaded here), driven by
Selenium. It opens the demo tree's page from `treepack view`, expands a branch, searches by glob,
checks that a heatmap's pixels come from the data (a known gradient), and opens the diff of two
trees and the history of a repository, through `treepack.view`. Screenshots are kept as the tests'
artefacts in $TREEPACK_VIEW_SCREENSHOTS, else target/view-screenshots/ (emptied when the tests
start; the folder is printed at the end of the run).

Skipped only when Chromium is absent and TREEPACK_REQUIRE_BROWSER is unset: scripts/test.sh sets
it, so CI fails rather than skips. Marked slow: the page is the same for every CPython, so the
per-wheel venvs leave it out."""

import io
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

import treepack

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM and DRIVER) and not os.environ.get("TREEPACK_REQUIRE_BROWSER"),
        reason="chromium and chromium-driver are not installed (scripts/browser.sh installs them)",
    ),
]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,900"]


@pytest.fixture(scope="module")
def shots(request):
    """The folder the screenshots are kept in, as the tests' artefacts (printed at the end)."""
    folder = Path(os.environ.get("TREEPACK_VIEW_SCREENSHOTS") or ROOT / "target" / "view-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    yield folder
    taken = sorted(p.name for p in folder.glob("*.png"))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and taken:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nviewer screenshots ({len(taken)}): {folder}")


@pytest.fixture
def browser(tmp_path, shots):
    assert CHROMIUM and DRIVER, "TREEPACK_REQUIRE_BROWSER is set but chromium or chromedriver is missing: run scripts/browser.sh"
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver named explicitly: Selenium then looks nothing up or down.
    driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver, shots, name):
    path = shots / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000, path
    return path


def wait(driver, what, timeout=15):
    """Wait until the JS expression `what` is truthy; its value."""
    end = time.time() + timeout
    while time.time() < end:
        v = driver.execute_script(f"return ({what});")
        if v:
            return v
        time.sleep(0.1)
    logs = driver.get_log("browser")
    raise AssertionError(f"timed out waiting for {what}; browser log: {logs}")


def no_errors(driver):
    """Nothing went wrong on the page: no banner, no script error in the console."""
    banner = driver.execute_script("return document.getElementById('error').hidden ? '' : document.getElementById('error-text').textContent")
    assert not banner, banner
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def expected_failures(driver, status):
    """Drain the console's log, where Chromium reports each failed request: only `status` failed."""
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert all(f"status of {status}" in e["message"] for e in severe), severe


def row_names(driver):
    return driver.execute_script("return [...document.querySelectorAll('#tree-rows .row .name')].map(e => e.textContent)")


def click_row(driver, name, caret=False):
    sel = "span.caret" if caret else "span.name"
    driver.execute_script(
        "const r = [...document.querySelectorAll('#tree-rows .row')].find(r => r.querySelector('.name').textContent === arguments[0]);"
        f"r.querySelector('{sel}').click();", name)


@pytest.fixture
def cli():
    exe = ROOT / "target" / "debug" / "treepack"
    assert exe.exists(), "the treepack CLI is not built: run `cargo build` (scripts/test.sh does)"
    return str(exe)


def test_demo_tree_expand_search_and_the_token(browser, shots, tmp_path, cli):
    demo = tmp_path / "demo"
    subprocess.run([cli, "demo", str(demo)], check=True, capture_output=True)
    proc = subprocess.Popen([cli, "view", str(demo), "--no-browser"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = next(w for w in line.split() if w.startswith("http://127.0.0.1:"))
        # Without the token: 403, and nothing of the tree.
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url.split("?")[0] + "api/info")
        assert e.value.code == 403
        browser.get(url)
        wait(browser, "document.querySelectorAll('#tree-rows .row').length >= 8")
        assert row_names(browser)[:3] == ["<root>", "params", "dtypes"]
        # Expand a branch: params, then dense.
        click_row(browser, "params", caret=True)
        wait(browser, "[...document.querySelectorAll('#tree-rows .name')].some(e => e.textContent === 'dense')")
        click_row(browser, "dense", caret=True)
        wait(browser, "[...document.querySelectorAll('#tree-rows .name')].some(e => e.textContent === 'kernel')")
        assert "512.0 KiB" in browser.execute_script("return document.getElementById('tree-rows').textContent")
        # Pick the kernel: its details and the heatmap.
        click_row(browser, "kernel")
        wait(browser, "document.getElementById('leaf-path').textContent === 'params/dense/kernel'")
        wait(browser, "document.getElementById('heatmap-canvas') && document.getElementById('heatmap-canvas').width === 256")
        details = browser.execute_script("return document.getElementById('leaf-details').textContent")
        assert "float32" in details and "[128, 256] on a [4, 1] grid" in details
        shot(browser, shots, "demo-expanded")
        # A slice outside the array: refused by the server, its message (the CLI's words) in the view.
        browser.execute_script("""
            const input = document.querySelector('#view-controls input[type=text]');
            input.value = '0:600, :';
            input.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));""")
        err = wait(browser, "document.querySelector('#view-body .error') && document.querySelector('#view-body .error').textContent")
        assert err.startswith("treepack: error:") and "outside the array" in err, err
        shot(browser, shots, "demo-slice-refused")
        expected_failures(browser, "400")
        # Search by glob: only matches listed, flat.
        box = browser.find_element("id", "search")
        box.send_keys("**/float*\n")
        wait(browser, "!document.getElementById('search-info').hidden")
        names = row_names(browser)
        assert names == ["dtypes/float16", "dtypes/float64", "dtypes/float8_e4m3fn", "dtypes/float8_e5m2"], names
        assert "4 matches" in browser.find_element("id", "search-info").text
        shot(browser, shots, "demo-search")
        # A 1-D array as a line plot (uPlot draws on a canvas of its own).
        click_row(browser, "dtypes/float16")
        wait(browser, "document.querySelector('#view-body .uplot canvas')")
        # Back to the tree, as it was.
        browser.find_element("id", "search-clear").click()
        assert "kernel" in row_names(browser)
        no_errors(browser)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_heatmap_pixels_come_from_the_data(browser, shots, tmp_path):
    # Each column's value is its index: a left-to-right gradient of 256 steps, and a NaN block.
    grad = np.tile(np.arange(256, dtype=np.float32), (64, 1))
    grad[60:, 250:] = np.nan
    treepack.save({"grad": grad, "cube": np.arange(2 * 3 * 4, dtype=np.int16).reshape(2, 3, 4)}, tmp_path / "t")
    with treepack.view(tmp_path / "t", open_browser=False) as server:
        browser.get(server.url + "#tab=tree&t=a&path=grad")
        wait(browser, "document.getElementById('heatmap-canvas') && document.getElementById('heatmap-canvas').width === 256")
        wait(browser, "document.getElementById('heatmap-canvas').dataset.hi === '255'")
        shot(browser, shots, "heatmap-gradient")
        # Read back the canvas's pixels and compare with the colormap of each value.
        pixels = browser.execute_script("""
            const c = document.getElementById('heatmap-canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            const at = (r, j) => Array.from(d.slice(4 * (r * c.width + j), 4 * (r * c.width + j) + 3));
            const cols = [0, 1, 64, 128, 200, 249];
            return {rows: c.height, got: cols.map(j => [j, at(10, j), Plots.colormap(j / 255)]), missing: at(63, 255),
                    want_missing: Plots.MISSING, lo: c.dataset.lo, hi: c.dataset.hi};
        """)
        assert pixels["rows"] == 64 and (pixels["lo"], pixels["hi"]) == ("0", "255")
        for j, got, want in pixels["got"]:
            assert all(abs(g - w) <= 1 for g, w in zip(got, want)), (j, got, want)
        firsts = [tuple(g) for _, g, _ in pixels["got"]]
        assert len(set(firsts)) == len(firsts), "every column a colour of its own"
        assert pixels["missing"] == pixels["want_missing"], "NaN blocks drawn apart"
        # A histogram of the same array: stats from the server, bars by uPlot.
        browser.find_element("css selector", '.views button[data-view="histogram"]').click()
        wait(browser, "document.querySelector('#view-body .uplot canvas')")
        stats = browser.find_element("id", "view-body").text
        assert "NaN" in stats and "16,384" in stats  # 64 × 256 elements
        # An n-D array: pick the axes; the other axis gets an index slider.
        browser.get("about:blank")
        browser.get(server.url + "#tab=tree&t=a&path=cube")
        wait(browser, "document.getElementById('heatmap-canvas') && document.getElementById('heatmap-canvas').width === 4")
        assert browser.execute_script("return document.querySelector('#view-controls input[type=text]').value") == "0, :, :"
        no_errors(browser)
        shot(browser, shots, "heatmap-3d")


def test_diff_of_two_trees(browser, shots, tmp_path):
    a = {"w": np.ones((8, 8), np.float32), "b": np.zeros(4), "old": 1}
    b = {"w": np.ones((8, 8), np.float32) * 2, "b": np.zeros(4), "new": "hello"}
    treepack.save(a, tmp_path / "a")
    treepack.save(b, tmp_path / "b")
    with treepack.view(tmp_path / "a", tmp_path / "b", open_browser=False) as server:
        browser.get(server.url)
        wait(browser, "document.querySelectorAll('#diff-table tr').length === 4")
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#diff-table tr')].slice(1).map(r => [...r.children].map(c => c.textContent))")
        by_path = {r[1]: r for r in rows}
        assert by_path["w"][0] == "~" and by_path["old"][0] == "-" and by_path["new"][0] == "+"
        # The change norm of w arrives: ‖2 - 1‖ / ‖1‖ = 1.
        wait(browser, "[...document.querySelectorAll('#diff-table tr')].some(r => r.children[1].textContent === 'w' && r.children[5].textContent === '1')")
        assert "1 added, 1 removed, 1 changed" in browser.find_element("id", "diff-summary").text
        shot(browser, shots, "diff")
        # Sortable: by path (a click; again: the other way), by the relative change (largest first).
        paths = "return [...document.querySelectorAll('#diff-table tr')].slice(1).map(r => r.children[1].textContent)"
        header = "[...document.querySelectorAll('#diff-table th')].find(t => t.textContent.startsWith(arguments[0])).click()"
        browser.execute_script(header, "path")
        assert browser.execute_script(paths) == ["new", "old", "w"]
        browser.execute_script(header, "path")
        assert browser.execute_script(paths) == ["w", "old", "new"]
        browser.execute_script(header, "‖Δ‖/‖a‖")
        assert browser.execute_script(paths)[0] == "w"
        # Click the changed row: the tree pane opens on it in the second tree.
        browser.execute_script("[...document.querySelectorAll('#diff-table tr')].find(r => r.children[1].textContent === 'w').click()")
        wait(browser, "document.getElementById('leaf-path').textContent === 'w' && !document.getElementById('pane-tree').hidden")
        assert browser.execute_script("return document.getElementById('source').value") == "b"
        no_errors(browser)


def test_history_of_a_repository(browser, shots, tmp_path):
    repo = tmp_path / "repo"
    treepack.Repository(repo, create=True)
    for step in range(3):
        treepack.save({"w": np.full((16, 16), step, np.float32) + np.eye(16, dtype=np.float32), "step": step}, f"{repo}@step{step}")
        time.sleep(0.01)
    with treepack.view(repo, open_browser=False) as server:
        browser.get(server.url)
        wait(browser, "document.querySelectorAll('#history-table tr').length === 4")
        names = browser.execute_script("return [...document.querySelectorAll('#history-table tr')].slice(1).map(r => r.children[0].textContent)")
        assert names == ["step0", "step1", "step2"]
        assert browser.execute_script("return document.getElementById('history-array').value") == "w"
        # The plot of w over the steps, with its relative change read from the data.
        wait(browser, "document.querySelector('#history-array-plot .uplot canvas') && document.getElementById('history-array-info').textContent === ''")
        shot(browser, shots, "history")
        # A step's row opens the diff of that step with the one before.
        browser.execute_script("document.querySelectorAll('#history-table tr')[2].click()")
        wait(browser, "!document.getElementById('pane-diff').hidden && document.querySelectorAll('#diff-table tr').length === 3")
        assert browser.execute_script("return [document.getElementById('diff-a').value, document.getElementById('diff-b').value]") == ["@step0", "@step1"]
        no_errors(browser)
        shot(browser, shots, "history-diff")
        # A tree of the repository that does not open: the error at the top, as the CLI words it.
        browser.get("about:blank")
        browser.get(server.url + "#tab=tree&t=@nope")
        banner = wait(browser, "!document.getElementById('error').hidden && document.getElementById('error-text').textContent")
        assert banner.startswith("treepack: error:") and "nope" in banner, banner
        shot(browser, shots, "history-missing-tree")
        expected_failures(browser, "404")


def test_a_wide_level_is_virtualised_and_paged(browser, shots, tmp_path):
    # 5,000 children in one level: a thousand fetched at a time, and only the rows in view in the page.
    treepack.save({"wide": {f"k{i:05d}": i for i in range(5000)}, "z": 1}, tmp_path / "t")
    with treepack.view(tmp_path / "t", open_browser=False) as server:
        browser.get(server.url)
        wait(browser, "document.querySelectorAll('#tree-rows .row').length === 3")
        click_row(browser, "wide", caret=True)
        wait(browser, "[...document.querySelectorAll('#tree-rows .name')].some(e => e.textContent === 'k00000')")
        spacer = "return parseInt(document.getElementById('tree-spacer').style.height)"
        # <root>, wide, 1,000 of its children, "… 4,000 more", z: 1,004 rows of 22 px.
        assert browser.execute_script(spacer) == 1004 * 22
        in_dom = "return document.querySelectorAll('#tree-rows .row').length"
        assert browser.execute_script(in_dom) < 100
        browser.execute_script("document.getElementById('tree-scroll').scrollTop = 1002 * 22 - 300")
        more = wait(browser, "[...document.querySelectorAll('#tree-rows .row.more')].map(e => e.textContent).join()")
        assert "4,000 more (load 1,000)" in more, more
        shot(browser, shots, "wide-level")
        browser.execute_script("document.querySelector('#tree-rows .row.more').click()")
        wait(browser, "parseInt(document.getElementById('tree-spacer').style.height) === 2004 * 22")
        assert browser.execute_script(in_dom) < 100
        browser.execute_script("document.getElementById('tree-scroll').scrollTop = 2002 * 22 - 300")
        wait(browser, "[...document.querySelectorAll('#tree-rows .name')].some(e => e.textContent === 'k01999')")
        assert "k00000" not in row_names(browser)
        no_errors(browser)


@pytest.fixture
def cli_view(cli):
    """`treepack view LOCATION --no-browser` as a process: the URL it prints (stopped after the test)."""
    procs = []

    def start(*locations):
        proc = subprocess.Popen([cli, "view", *map(str, locations), "--no-browser"], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        return next(w for w in line.split() if w.startswith("http://127.0.0.1:"))

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def image_pixels(driver):
    """The image view's pixels, drawn at their natural size on a canvas: (width, height, RGBA bytes)."""
    wait(driver, "document.getElementById('image-view') && document.getElementById('image-view').dataset.ready === '1'")
    return driver.execute_script("""
        const img = document.getElementById('image-view');
        const c = document.createElement('canvas');
        c.width = img.naturalWidth; c.height = img.naturalHeight;
        const ctx = c.getContext('2d');
        ctx.drawImage(img, 0, 0);
        return [c.width, c.height, Array.from(ctx.getImageData(0, 0, c.width, c.height).data)];
    """)


def test_images_are_shown_as_images(browser, shots, tmp_path, cli_view):
    # Red rises along the columns, green down the rows, blue a constant 7.
    rows, cols = np.mgrid[0:32, 0:48]
    rgb = np.stack([cols * 5, rows * 8, np.full_like(rows, 7)], axis=-1).astype(np.uint8)
    grey = np.linspace(0, 1, 40 * 30, dtype=np.float32).reshape(40, 30)
    # A second of 8 kHz mono WAV held in a bytes leaf: playable in the page.
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes((np.sin(np.arange(8000) * 0.3) * 3000).astype("<i2").tobytes())
    treepack.save({"rgb": rgb, "grey": grey, "clip": wav.getvalue()}, tmp_path / "t")
    url = cli_view(tmp_path / "t")
    browser.get(url + "#tab=tree&t=a&path=rgb")
    # A uint8 (H, W, 3) array opens on its image.
    wait(browser, "document.querySelector('.views button.active') && document.querySelector('.views button.active').dataset.view === 'image'")
    w, h, px = image_pixels(browser)
    assert (w, h) == (48, 32)
    got = np.array(px, np.uint8).reshape(h, w, 4)
    assert (got[..., :3] == rgb).all() and (got[..., 3] == 255).all(), "every pixel the array's"
    assert "48 × 32 pixels (RGB)" in browser.find_element("id", "view-body").text
    shot(browser, shots, "image-rgb")
    # A float array in 0–1 is offered as an image after its heatmap: grey levels of the values.
    browser.get("about:blank")
    browser.get(url + "#tab=tree&t=a&path=grey")
    wait(browser, "document.querySelector('.views button[data-view=\"image\"]')")
    browser.find_element("css selector", '.views button[data-view="image"]').click()
    w, h, px = image_pixels(browser)
    got = np.array(px, np.uint8).reshape(h, w, 4)
    assert (w, h) == (30, 40)
    assert np.abs(got[..., 0].astype(int) - np.round(grey * 255).astype(int)).max() <= 1
    assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all(), "grey"
    no_errors(browser)
    # Audio held in bytes: an <audio> element the browser decodes (its length read from the WAV).
    browser.get("about:blank")
    browser.get(url + "#tab=tree&t=a&path=clip")
    duration = wait(browser, "document.querySelector('#view-body audio') && document.querySelector('#view-body audio').readyState >= 1 "
                             "&& document.querySelector('#view-body audio').duration")
    assert abs(duration - 1.0) < 0.01, duration
    assert "audio/wav" in browser.find_element("id", "view-body").text
    shot(browser, shots, "audio")
    no_errors(browser)


def test_dataframes_are_shown_as_tables(browser, shots, tmp_path, cli_view):
    pd = pytest.importorskip("pandas")
    n = 120
    df = pd.DataFrame({
        "count": np.arange(n) * 10,
        "name": [f"é{i}" if i != 2 else None for i in range(n)],
        "colour": pd.Categorical(["red", "blue"] * (n // 2)),
        "when": pd.date_range("2024-01-01", periods=n, freq="D"),
        "maybe": pd.array([None if i % 3 == 0 else i for i in range(n)], dtype="Int64"),
    }, index=pd.RangeIndex(100, 100 + 2 * n, 2, name="row"))
    treepack.save({"df": df, "s": pd.Series([1.5, 2.5], name="x")}, tmp_path / "t")
    url = cli_view(tmp_path / "t")
    browser.get(url + "#tab=tree&t=a&path=df")
    wait(browser, "document.getElementById('frame-table')")
    table = browser.execute_script(
        "return [...document.querySelectorAll('#frame-table tr')].map(r => [...r.children].map(c => c.textContent))")
    assert table[0] == ["row", "count", "name", "colour", "when", "maybe"]
    # dtypes as pandas prints them.
    assert table[1] == ["range"] + [str(df[c].dtype) for c in df.columns], table[1]
    assert table[2] == ["100", "0", "é0", "red", "2024-01-01 00:00:00", "–"], table[2]
    assert table[3][4] == "2024-01-02 00:00:00"
    assert table[4][2] == "–" and table[3][5] == "1", table[3:5]
    assert len(table) == 2 + 50
    assert "rows 1–50 of 120" in browser.find_element("id", "frame-info").text
    shot(browser, shots, "dataframe")
    # The next page.
    browser.find_element("id", "frame-next").click()
    wait(browser, "document.getElementById('frame-info').textContent.startsWith('rows 51–100 of 120')")
    assert browser.execute_script("return document.querySelectorAll('#frame-table tr')[2].children[0].textContent") == "200"
    # A Series: one column, named.
    browser.get("about:blank")
    browser.get(url + "#tab=tree&t=a&path=s")
    wait(browser, "document.getElementById('frame-table')")
    assert browser.execute_script("return document.querySelector('#frame-table tr').textContent") == "x"
    no_errors(browser)


def test_history_of_a_checkpoint_manager_directory(browser, shots, tmp_path, cli_view):
    ckpts = tmp_path / "ckpts"
    mgr = treepack.CheckpointManager(ckpts, keep_last=None)
    for step in (0, 100, 200):
        mgr.save(step, {"w": np.full((8, 8), step, np.float32), "step": step}, blocking=True)
        time.sleep(0.01)
    mgr.wait_until_finished()
    url = cli_view(ckpts)
    browser.get(url)
    wait(browser, "document.querySelectorAll('#history-table tr').length === 4")
    names = browser.execute_script("return [...document.querySelectorAll('#history-table tr')].slice(1).map(r => r.children[0].textContent)")
    assert names == ["step-0", "step-100", "step-200"]
    assert browser.execute_script("return document.getElementById('history-array').value") == "w"
    wait(browser, "document.querySelector('#history-array-plot .uplot canvas') && document.getElementById('history-array-info').textContent === ''")
    shot(browser, shots, "checkpoint-manager-history")
    no_errors(browser)
