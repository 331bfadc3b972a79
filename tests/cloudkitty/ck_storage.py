"""CloudKitty 25.0.0's own v2 storage driver, driven by the tests (run by CloudKitty's venv's Python).

``python ck_storage.py push|count|total`` reads one JSON object on stdin:
``{"backend": "influxdb"|"elasticsearch"|"opensearch"|"loki", "options": {<[storage_<backend>] options>},
"points": [...]}`` (push) or ``{"backend", "options", "begin", "end"}`` (count, total), and prints
JSON: nothing for push, ``{"total": N}`` for count (CloudKitty's ``retrieve``), and CloudKitty's
``total(groupby=["project_id", "type"])`` rows as ``{"<project>|<type>": [qty, rate]}`` (strings).
A point is ``{"begin", "end", "type", "unit", "qty", "price", "groupby": {}, "metadata": {},
"scope_id"}`` with ISO times; ``push`` writes them the way cloudkitty-processor does: one
``DataFrame`` per period, ``push(frames, scope_id)`` per scope.
"""

import importlib
import json
import sys
import warnings
from collections import defaultdict
from decimal import Decimal

warnings.filterwarnings("ignore")

import cloudkitty.config  # noqa: E402, F401  (registers CloudKitty's options)
from cloudkitty import dataframe, storage  # noqa: E402
from cloudkitty.utils import tz as tzutils  # noqa: E402
from oslo_config import cfg  # noqa: E402

command = sys.argv[1]
request = json.load(sys.stdin)
cfg.CONF([], project="cloudkitty", default_config_files=[])
cfg.CONF.set_override("version", 2, "storage")
cfg.CONF.set_override("backend", request["backend"], "storage")
DRIVERS = {"influxdb": "influx", "elasticsearch": "elasticsearch", "opensearch": "opensearch", "loki": "loki"}
importlib.import_module(f"cloudkitty.storage.v2.{DRIVERS[request['backend']]}")  # registers its options
for name, value in request["options"].items():
    cfg.CONF.set_override(name, value, f"storage_{request['backend']}")
driver = storage.get_storage()
driver.init()


def when(text):
    return tzutils.dt_from_iso(text)


if command == "push":
    frames = defaultdict(dict)  # scope -> begin -> DataFrame
    for p in request["points"]:
        frame = frames[p["scope_id"]].setdefault(p["begin"], dataframe.DataFrame(when(p["begin"]), when(p["end"])))
        frame.add_point(dataframe.DataPoint(p["unit"], Decimal(p["qty"]), Decimal(p["price"]), p["groupby"],
                                            p["metadata"]), p["type"])
    for scope, by_begin in sorted(frames.items()):
        driver.push([by_begin[b] for b in sorted(by_begin)], scope)
elif command == "count":
    print(json.dumps({"total": driver.retrieve(begin=when(request["begin"]), end=when(request["end"]),
                                                      limit=5000)["total"]}))
else:
    answer = driver.total(groupby=["project_id", "type"], begin=when(request["begin"]), end=when(request["end"]),
                          limit=5000, paginate=False)  # Loki's driver refuses more
    print(json.dumps({f"{r['project_id']}|{r['type']}": [str(r["qty"]), str(r["rate"])]
                      for r in answer["results"]}))
