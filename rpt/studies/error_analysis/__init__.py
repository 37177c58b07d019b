"""The error analysis of a checkpoint's rows (Table 2, Fig. 6): the estimators and their summary, and its
command's runs."""
