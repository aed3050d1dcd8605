package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// curve is one latency-by-percentile line of a plot.
type curve struct {
	label  string
	hist   *hdrhistogram.Histogram // ns
	dashed bool
}

// Plot geometry, in SVG user units.
const (
	plotWidth     = 960
	plotHeight    = 560
	marginLeft    = 80
	marginRight   = 30
	marginTop     = 70
	marginBottom  = 60
	maxDecades    = 6 // the x axis ends at 99.9999% at most
	ticksPerHalf  = 5 // HdrHistogram's percentile iteration: points per halving
	legendLine    = 20
	legendPadding = 10
)

// palette colours the curves in order.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// writePlot draws the curves on one chart, as HdrHistogram's plots do:
// x is the percentile on a log scale of 1/(1-p) (0%, 90%, 99%, 99.9%…),
// y the latency, also on a log scale, so that a median of microseconds
// and a tail of milliseconds both show. Each curve is named in a legend.
// The SVG is hand-written: no dependency.
func writePlot(w io.Writer, title, subtitle string, curves []curve) error {
	var maxCount int64
	minV, maxV := math.Inf(1), math.Inf(-1)
	for _, c := range curves {
		if c.hist.TotalCount() == 0 {
			continue
		}
		maxCount = max(maxCount, c.hist.TotalCount())
		minV = min(minV, float64(c.hist.Min()))
		maxV = max(maxV, float64(c.hist.Max()))
	}
	if maxCount == 0 { // nothing recorded: draw empty axes
		minV, maxV = 1e3, 1e6
	}
	decades := min(max(int(math.Ceil(math.Log10(float64(maxCount)))), 1), maxDecades)
	// y axis, in ns: whole decades around the data.
	yLo := math.Pow(10, math.Floor(math.Log10(max(minV, 1))))
	yHi := math.Pow(10, math.Ceil(math.Log10(max(maxV, yLo*10))))
	if yHi <= yLo {
		yHi = yLo * 10
	}

	left, right := float64(marginLeft), float64(plotWidth-marginRight)
	top, bottom := float64(marginTop), float64(plotHeight-marginBottom)
	xOf := func(q float64) float64 { // q: percentile, 0–100
		d := maxDecades + 1.0
		if q < 100 {
			d = math.Log10(100 / (100 - q))
		}
		return left + (right-left)*min(d, float64(decades))/float64(decades)
	}
	yOf := func(ns float64) float64 {
		v := math.Log10(min(max(ns, yLo), yHi))
		return bottom - (bottom-top)*(v-math.Log10(yLo))/(math.Log10(yHi)-math.Log10(yLo))
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">
<rect width="100%%" height="100%%" fill="white"/>
`, plotWidth, plotHeight, plotWidth, plotHeight)
	text(&b, plotWidth/2, 24, "middle", 16, title)
	text(&b, plotWidth/2, 44, "middle", 12, subtitle)

	// Grid and axes.
	b.WriteString(`<g stroke="#ddd" stroke-width="1">` + "\n")
	for d := 0; d <= decades; d++ {
		x := left + (right-left)*float64(d)/float64(decades)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n", x, top, x, bottom)
	}
	var yTicks []float64
	for dec := yLo; dec < yHi*1.001; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := dec * m; v <= yHi*1.001 {
				yTicks = append(yTicks, v)
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n", left, yOf(v), right, yOf(v))
			}
		}
	}
	b.WriteString("</g>\n")
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n",
		left, top, right-left, bottom-top)
	for d := 0; d <= decades; d++ {
		x := left + (right-left)*float64(d)/float64(decades)
		text(&b, x, bottom+18, "middle", 12, percentileLabel(d))
	}
	for _, v := range yTicks {
		text(&b, left-6, yOf(v)+4, "end", 12, formatMicros(v/1e3))
	}
	text(&b, (left+right)/2, plotHeight-16, "middle", 13, "percentile")
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle" font-size="13">latency (log scale)</text>`+"\n",
		(top+bottom)/2)

	// Curves.
	for i, c := range curves {
		if c.hist.TotalCount() == 0 {
			continue
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="`, palette[i%len(palette)], dash(c.dashed))
		for j, br := range c.hist.CumulativeDistributionWithTicks(ticksPerHalf) {
			if j > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", xOf(br.Quantile), yOf(float64(br.ValueAt)))
		}
		b.WriteString(`"/>` + "\n")
	}

	// Legend, top left, inside the plot.
	longest := 0
	for _, c := range curves {
		longest = max(longest, len([]rune(c.label)))
	}
	lx, ly := left+legendPadding, top+legendPadding
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%d" height="%d" fill="white" fill-opacity="0.9" stroke="#999"/>`+"\n",
		lx, ly, 50+7*longest, legendLine*len(curves)+legendPadding)
	for i, c := range curves {
		y := ly + legendPadding + float64(i*legendLine) + legendLine/2
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n",
			lx+8, y-4, lx+38, y-4, palette[i%len(palette)], dash(c.dashed))
		text(&b, lx+44, y, "start", 12, c.label)
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// percentileLabel returns the x axis label of decade d: 0%, 90%, 99%…
func percentileLabel(d int) string {
	if d == 0 {
		return "0%"
	}
	if d == 1 {
		return "90%"
	}
	if d == 2 {
		return "99%"
	}
	return "99." + strings.Repeat("9", d-2) + "%"
}

func dash(dashed bool) string {
	if dashed {
		return ` stroke-dasharray="6 4"`
	}
	return ""
}

// text writes an escaped <text> element.
func text(b *bytes.Buffer, x, y float64, anchor string, size int, s string) {
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d">`, x, y, anchor, size)
	xml.EscapeText(b, []byte(s))
	b.WriteString("</text>\n")
}
