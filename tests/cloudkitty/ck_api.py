"""CloudKitty 25.0.0's own API (its WSGI app), served on 127.0.0.1 for the tests (CloudKitty's venv).

``python ck_api.py CONFIG_FILE PORT``: CloudKitty's wheel has no ``cloudkitty-api`` script and no
``api_paste.ini``, so this script writes ``api_paste.ini`` beside CONFIG_FILE (which must name it
as ``api_paste_config``), without the ``healthcheck`` filter that oslo.middleware refuses there,
noauth only.  It imports keystonemiddleware's ``auth_token`` options, which CloudKitty's hashmap
mapping controller reads even in noauth mode (``common/custom_session.py``: without them creating a
mapping answers 500, ``no such option keystone_authtoken``; the config's ``[keystone_authtoken]``
then names keystoneauth's ``none`` plugin, and a request without a token is made by ``unknown``).
It then loads the app exactly as
CloudKitty's own WSGI entry point does (``cloudkitty.api.app.build_wsgi_app``) and serves it with
the standard library's threading WSGI server until killed.
"""

import socketserver
import sys
import warnings
from pathlib import Path
from wsgiref import simple_server

warnings.filterwarnings("ignore")

import keystonemiddleware.auth_token  # noqa: E402, F401  (registers [keystone_authtoken])
from cloudkitty.api import app  # noqa: E402

PAPER = """\
[pipeline:cloudkitty+noauth]
pipeline = request_id ck_api

[app:ck_api]
paste.app_factory = cloudkitty.api.app:app_factory

[filter:request_id]
paste.filter_factory = oslo_middleware:RequestId.factory
"""


class _Server(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True


class _Quiet(simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass


config_file, port = sys.argv[1], int(sys.argv[2])
Path(config_file).with_name("api_paste.ini").write_text(PAPER)
sys.argv = ["cloudkitty-api", "--config-file", config_file]  # build_wsgi_app parses sys.argv
application = app.build_wsgi_app()
server = simple_server.make_server("127.0.0.1", port, application, server_class=_Server, handler_class=_Quiet)
print("ready", flush=True)
server.serve_forever()
