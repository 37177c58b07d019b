"""The controlled experiment: a hidden Markov source, the exact law of sampling from a model of it (NTP
and RPT), the model measured against the truth, and Sec. 3's theory as a prediction over it."""
