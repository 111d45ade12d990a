"""What the tests share: in-process bookies and clusters (bookie, client), metadata
drivers and stores (metadata, zk), small real file systems (disk), the GC and journal
tests' helpers (gc, journal), native-shim switches (native), and the torture harness
(torture/). Importable as ``support.<name>`` from every test: tests/ is on sys.path
(the root conftest.py's directory).
"""
