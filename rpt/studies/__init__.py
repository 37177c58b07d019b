"""The studies, one package each: Sec. 3's synthetic experiment and error measures (``sec3``), the controlled
source with its exact laws and Sec. 3's theory as a prediction (``controlled``), the agreement-pairs study
(``agreement``), the scaling study (``scaling``), the error analysis of a checkpoint's rows
(``error_analysis``) and degenerate repetition (``repetition``); beside them the demo's seed study, the TV
summary by RPT iteration, the pre-registration guards and the directories a study owns."""
