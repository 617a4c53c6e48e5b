"""Arrow-side logic shared by the storage layer and the step: the platform's type names as
Arrow types, change visibility and netting on Arrow tables, and the MV definition compiled to
Arrow kernels with Spark's results. No Spark, no Delta, no Dagster."""
