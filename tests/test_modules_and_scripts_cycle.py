"""The rating module chain inside a real cycle: a safe script adds to the hashmap's price.

``ratebeam scripts add`` stores a JSON script, ``ratebeam modules enable scripted`` turns the
module on; the hashmap (priority 1) and the script then both price each point, as CloudKitty chains
hashmap and pyscripts.  A script that would run code is refused with exit status 2.
"""

from __future__ import annotations

import json
from decimal import Decimal

import polars as pl
from pipeline_support import ratebeam, run_cycle, setup_database, stored_rows, workspace


def test_scripted_module_adds_a_fee_after_the_hashmap(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    script = tmp_path / "fee.json"
    script.write_text(json.dumps({
        "name": "windows-fee",
        "steps": [{"set": "price", "expr": "price + 0.01 * qty",
                   "where": "type = 'instance' AND \"metadata.os_distro\" = 'windows'"}],
    }))
    c = str(config)
    assert ratebeam("scripts", "add", "-c", c, str(script), "--start", "2025-01-01").returncode == 0
    assert ratebeam("modules", "enable", "-c", c, "scripted").returncode == 0
    # CloudKitty order: higher priority first; the hashmap adds to whatever price it receives.
    assert ratebeam("modules", "priority", "-c", c, "scripted", "2").returncode == 0
    listing = ratebeam("modules", "list", "-c", c).stdout
    assert "scripted" in listing and "True" in listing

    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    rows = stored_rows(config).filter(pl.col("qty") > 0)
    windows = rows.filter((pl.col("type") == "instance") & (pl.col("metadata.os_distro") == "windows"))
    others = rows.filter((pl.col("type") == "instance") & (pl.col("metadata.os_distro") == "ubuntu")
                         & (pl.col("metadata.flavor_name") == "m1.medium"))
    # globex m1.small windows: hashmap 0.02 + 0.03, script + 0.01 per instance-hour.
    assert set(windows.filter(pl.col("metadata.flavor_name") == "m1.small")["price"].to_list()) == {Decimal("0.06")}
    assert set(others["price"].to_list()) == {Decimal("0.04")}  # untouched by the script


def test_a_script_that_tries_to_run_code_is_refused(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    script = tmp_path / "evil.json"
    script.write_text(json.dumps({"name": "evil", "steps": [
        {"set": "price", "expr": "(SELECT 1 FROM read_csv('/etc/passwd'))"}]}))
    done = ratebeam("scripts", "add", "-c", str(config), str(script))
    assert done.returncode == 2, done.stderr
    assert "evil.json: steps[0].expr" in done.stderr
    assert "Traceback" not in done.stderr
    assert "evil" not in ratebeam("scripts", "list", "-c", str(config)).stdout
