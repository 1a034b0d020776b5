"""Static files storage: hashed, compressed names, with the `import` lines of the page's ES
modules rewritten to the hashed names too (so a deploy never mixes an old module with a new
one)."""

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticStorage(CompressedManifestStaticFilesStorage):
    support_js_module_import_aggregation = True
