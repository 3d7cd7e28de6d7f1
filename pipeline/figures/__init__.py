"""Figures: training curves (``curves``), attention heatmaps (``attention_plots``) and the paper's
figures and worked numbers (``paper_figures``, ``make docs``)."""
