"""dvc.yaml: a second repro is a no-op; an evaluate param reruns only evaluate; metrics and plots work."""


def test_second_repro_is_a_no_op(workspace):
    out = workspace.second_repro.stdout
    assert workspace.second_repro.returncode == 0
    assert "Running stage" not in out
    assert "Data and pipelines are up to date" in out


def test_evaluate_param_reruns_only_evaluate(beam1_experiment):
    ran = [line for line in beam1_experiment.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == ["Running stage 'evaluate':"]


def test_metrics_and_plots_commands(workspace, beam1_experiment):
    show = workspace.dvc("metrics", "show")
    assert show.returncode == 0 and "test_2016_flickr.bleu" in show.stdout
    diff = workspace.dvc("metrics", "diff")
    assert diff.returncode == 0
    plots = workspace.dvc("plots", "show", "-o", "plots_html")
    assert plots.returncode == 0, plots.stderr
    assert (workspace.path / "plots_html" / "index.html").is_file()
