"""The studies: the synthetic NTP-vs-RPT experiment, the controlled source (HMM + exact window
chain) and Sec. 3's theory as a prediction over it, the error analysis of a checkpoint's rows,
the degenerate-repetition metric and study, and the seed study of the demo."""
