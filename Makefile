# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
PORT ?= 8000

.PHONY: run test lint screenshot install clean token

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

var/secret_key:
	mkdir -p var
	$(PYTHON) -c "import secrets; print(secrets.token_urlsafe(50))" > $@
	chmod 600 $@

# The web process's memory settings, as the Procfile's (harness/processes.py, WEB_ENV, says
# why): jemalloc where it is installed (Debian's libjemalloc2), glibc's malloc tuned otherwise.
JEMALLOC := $(firstword $(wildcard /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2))
WEB_MEMORY = $(if $(JEMALLOC),LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=background_thread:true) PYTHONMALLOC=malloc GLIBC_TUNABLES=glibc.malloc.mmap_threshold=262144:glibc.malloc.trim_threshold=131072

## Install, migrate and start the whole system on the embedded defaults.
run: $(STAMP) var/secret_key
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py migrate --no-input
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py collectstatic --no-input -v 0
	AWAKEN_DEMO_AGENTS=1 SECRET_KEY=$$(cat var/secret_key) $(WEB_MEMORY) $(BIN)/python manage.py serve --port $(PORT)

## Lint once, then run the tests. With DATABASE_URL unset: the whole suite on SQLite (the
## in-memory layer and broker). With DATABASE_URL=postgres://... (and REDIS_URL=redis://...
## for the tests of real workers and the Redis layer): three streams side by side, each test
## run once per database it proves something on. The tests of the test database run on SQLite
## and on that PostgreSQL database (but those marked one_backend, whose verdict no backend
## changes, only on SQLite); the tests marked ignores_database_url (sites, browsers and
## processes of their own, which use neither variable) run once: the long files of them
## (marked sites_stream) in a stream of their own, the rest in the SQLite stream, so the
## three take about as long. They wait on processes more than they compute, and this is a
## 2-core machine. A stream that
## PYTEST_ARGS leave without a test (pytest's exit 5) is no failure. PASS=sqlite,
## PASS=postgres or PASS=sites runs one stream; PYTEST_ARGS go to each (a file, -x,
## --durations=30...).
PASS ?= $(if $(DATABASE_URL),all,sqlite)
PYTEST_ARGS ?=
NO_SERVICES = env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL
SQLITE_PASS = $(NO_SERVICES) $(BIN)/pytest $(if $(DATABASE_URL),-m "not sites_stream") $(PYTEST_ARGS)
POSTGRES_PASS = $(BIN)/pytest -m "not ignores_database_url and not one_backend" $(PYTEST_ARGS)
SITES_PASS = $(NO_SERVICES) $(BIN)/pytest -m sites_stream $(PYTEST_ARGS)
test: lint
ifeq ($(strip $(PASS)),sqlite)
	$(SQLITE_PASS)
else ifeq ($(strip $(PASS)),sites)
	$(SITES_PASS)
else ifeq ($(strip $(PASS)),postgres)
	$(if $(DATABASE_URL),,$(error PASS=postgres needs DATABASE_URL=postgres://...))
	$(POSTGRES_PASS)
else
	$(if $(DATABASE_URL),,$(error the three streams need DATABASE_URL=postgres://...))
	@mkdir -p var
	@$(POSTGRES_PASS) > var/test-postgres.log 2>&1 & postgres=$$!; \
	$(SITES_PASS) > var/test-sites.log 2>&1 & sites=$$!; \
	echo "== SQLite stream (the PostgreSQL and sites streams alongside, into var/test-*.log)"; \
	$(SQLITE_PASS); sqlite=$$?; \
	wait $$sites; st=$$?; \
	wait $$postgres; pg=$$?; \
	echo "== Sites stream (var/test-sites.log)"; cat var/test-sites.log; \
	echo "== PostgreSQL stream (var/test-postgres.log)"; cat var/test-postgres.log; \
	echo "== failed in the sites and PostgreSQL streams:"; \
	grep -h -e '^FAILED ' -e '^ERROR ' var/test-sites.log var/test-postgres.log || echo none; \
	echo "== exit: SQLite $$sqlite, sites $$st, PostgreSQL $$pg (5: the stream had no test)"; \
	for code in $$sqlite $$st $$pg; do test $$code = 0 || test $$code = 5 || exit 1; done
endif

clean:
	rm -rf $(VENV) var/static

## Lint with ruff, and check the layers and cycles of the imports (both configured in
## pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check runs awaken_site harness tests examples
	$(BIN)/lint-imports

## An API token for NAME (an operator; ROLE=viewer for read-only) on the embedded default,
## with the key `make run` keeps: make token NAME=alice
NAME ?= $(USER)
ROLE ?= operator
token: $(STAMP) var/secret_key
	@SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py migrate --no-input -v 0
	@SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py operator_token "$(NAME)" --create --role $(ROLE)

## Redraw the README's pictures of the console (docs/<page>-<size>.png) with Debian's
## chromium (the command starts an embedded site of its own, in a temporary directory).
ARGS ?=
screenshot: $(STAMP) var/secret_key
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py screenshot $(ARGS)
