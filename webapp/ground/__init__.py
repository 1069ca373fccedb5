"""The ground of the web app: the records of experiments and their trials that every other app reads.

Its models (`Experiment`, `Trial`, a trial's download archive and generations, a draft's preview, a saved
comparison) import no other web app: they name other apps' models by their label ("accounts.Team",
"datasets.Dataset"), so every app may build on them while the experiments app (`webapp.experiments`: forms,
planning, launching, the workers' reports, pages) sits above the others. Methods here compute from the row
and the settings only; what calls the queue or another app is a service of the app that does it.

The app keeps the label ``experiments`` (`apps.GroundConfig`) and the migrations of the app its models were
defined in: the label is what the database knows them by (table names such as ``experiments_trial``, content
types, permissions and the migration history), so nothing in a database changes and an existing one migrates
on as before.
"""
