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

# The web process's memory settings, as the Procfile's (harness/processes.py, WEB_ENV, says why).
WEB_MEMORY = PYTHONMALLOC=malloc GLIBC_TUNABLES=glibc.malloc.mmap_threshold=262144:glibc.malloc.trim_threshold=131072

## Install, migrate and start the whole system on the embedded defaults.
run: $(STAMP) var/secret_key
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py migrate --no-input
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py collectstatic --no-input -v 0
	AWAKEN_DEMO_AGENTS=1 SECRET_KEY=$$(cat var/secret_key) $(WEB_MEMORY) $(BIN)/python manage.py serve --port $(PORT)

## Lint once, then run the test suite on SQLite (the in-memory layer and broker). With
## DATABASE_URL=postgres://... set (and REDIS_URL=redis://... for the tests of real workers and
## the Redis layer), a second pass runs on that PostgreSQL database: every test but those
## marked ignores_database_url (sites, browsers and processes of their own, which use neither
## variable and proved what they prove in the first pass). PASS=sqlite or PASS=postgres runs
## one pass only; PYTEST_ARGS go to each pass (a file, -x, --durations=30...).
PASS ?= $(if $(DATABASE_URL),sqlite postgres,sqlite)
PYTEST_ARGS ?=
SQLITE_PASS = env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL $(BIN)/pytest $(PYTEST_ARGS)
POSTGRES_PASS = $(BIN)/pytest -m "not ignores_database_url" $(PYTEST_ARGS)
## Both passes at once (they wait on processes more than they compute, and this is a
## 2-core machine): the PostgreSQL pass writes to var/test-postgres.log, shown when it ends.
test: lint
ifeq ($(strip $(PASS)),sqlite)
	$(SQLITE_PASS)
else ifeq ($(strip $(PASS)),postgres)
	$(if $(DATABASE_URL),,$(error PASS=postgres needs DATABASE_URL=postgres://...))
	$(POSTGRES_PASS)
else
	$(if $(DATABASE_URL),,$(error both passes need DATABASE_URL=postgres://...))
	@mkdir -p var
	@$(POSTGRES_PASS) > var/test-postgres.log 2>&1 & postgres=$$!; \
	echo "== SQLite pass (PostgreSQL pass alongside, into var/test-postgres.log)"; \
	$(SQLITE_PASS); sqlite=$$?; \
	wait $$postgres; pg=$$?; \
	echo "== PostgreSQL pass (var/test-postgres.log)"; cat var/test-postgres.log; \
	echo "== SQLite pass exit $$sqlite, PostgreSQL pass exit $$pg"; \
	test $$sqlite = 0 && test $$pg = 0
endif

clean:
	rm -rf $(VENV) var/static

## Lint with ruff, and check the layers and cycles of the imports (both configured in
## pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check runs awaken_site harness tests examples
	$(BIN)/lint-imports

## Redraw the README's pictures of the console (docs/<page>-<size>.png) with Debian's
## chromium (the command starts an embedded site of its own, in a temporary directory).
## An API token for NAME (an operator; ROLE=viewer for read-only) on the embedded default,
## with the key `make run` keeps: make token NAME=alice
NAME ?= $(USER)
ROLE ?= operator
token: $(STAMP) var/secret_key
	@SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py migrate --no-input -v 0
	@SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py operator_token "$(NAME)" --create --role $(ROLE)

ARGS ?=
screenshot: $(STAMP) var/secret_key
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py screenshot $(ARGS)
