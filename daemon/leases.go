package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window/lease"
)

// leaseCollectors are the lease holder's counters for /metrics.
func leaseCollectors(h *lease.Holder) []prometheus.Collector {
	counter := func(name, help string, v func(lease.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(v(h.Stats())) })
	}
	return []prometheus.Collector{
		counter("flashgate_leases_total", "Leases taken: reservations of a leased rule's admissions that granted at least one slot.",
			func(s lease.Stats) uint64 { return s.Leases }),
		counter("flashgate_lease_refusals_total", "Reservations of a leased rule's admissions that granted nothing: the window had no room for the least worth a grant.",
			func(s lease.Stats) uint64 { return s.Refusals }),
		counter("flashgate_lease_slots_reserved_total", "Slots reserved in leased rules' windows.",
			func(s lease.Stats) uint64 { return s.Reserved }),
		counter("flashgate_lease_slots_returned_total", "Slots of ended leases given back unused.",
			func(s lease.Stats) uint64 { return s.Returned }),
		counter("flashgate_lease_admissions_total", "Admissions made from a lease, without a Redis call of their own.",
			func(s lease.Stats) uint64 { return s.Admitted }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "flashgate_leases_held", Help: "Leases this sidecar holds open now."},
			func() float64 { return float64(h.Stats().Held) }),
	}
}
